"""A local Sphinx extension (book/_config.yml, `local_extensions`): keep the site to itself.

Jupyter Book 1.x always loads sphinx-thebe, which adds an inline script naming thebe's URL on
unpkg.com and a loader for it, for live code cells. The book has no live cells (thebe is off),
and under Sphinx 7.4 sphinx-thebe 0.3.1 adds the inline script twice, which the browser
reports as an error ("Identifier 'THEBE_JS_URL' has already been declared"). So its hook that
adds them is disconnected: the pages carry no reference to another host.
"""

import sphinx_thebe


def setup(app):
    app.setup_extension("sphinx_thebe")
    for listener in list(app.events.listeners.get("env-before-read-docs", [])):
        if listener.handler is sphinx_thebe.init_thebe_core:
            app.events.disconnect(listener.id)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
