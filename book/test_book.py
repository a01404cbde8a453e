"""The book, built and opened page by page in a real browser (Debian's chromium, driven by
Playwright), served from 127.0.0.1 only: nothing may come from another host.

Runs last in the README's test command, after nbmake has executed every notebook; the build
reuses those executions (root conftest.py, book/nbcache.py) and only runs Sphinx. Every page
that Sphinx wrote for a document (its own search index lists them) is checked for: console
errors and failed or >= 400 requests; requests to any other host; images that did not load;
as many figures in each notebook page's outputs as its executed notebook has image outputs;
internal links that do not resolve (status 200, and the #anchor exists on the target); math
that MathJax did not typeset (every math element rendered, no error node, no raw $$ left);
traceback text. A screenshot of each page goes to build/book/screenshots/.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.parse
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "build" / "book"
HTML, SRC, SHOTS = OUT / "html", OUT / "src", OUT / "screenshots"
CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
TRACEBACK = "Traceback (most recent call last)"


def browser_or_skip():
    """Playwright's sync API, or a skip naming what is missing (a failure where CI=true)."""
    why = None
    if not CHROMIUM.exists():
        why = f"no {CHROMIUM}: install Debian's package `chromium` (apt-get install -y chromium)"
    else:
        try:
            from playwright.sync_api import sync_playwright
        except ImportError:
            why = "the `playwright` package is missing: pip install -e '.[dev]'"
    if why:
        (pytest.fail if os.environ.get("CI") == "true" else pytest.skip)(why)
    return sync_playwright


def documents() -> list[str]:
    """The documents Sphinx built, from its own search index (searchindex.js)."""
    text = (HTML / "searchindex.js").read_text(encoding="utf-8")
    index = json.loads(text[text.index("(") + 1:text.rindex(")")])
    return index["docnames"]


def image_outputs(docname: str) -> int | None:
    """How many image outputs the executed notebook behind a page has (None: not a notebook)."""
    path = SRC / f"{docname}.ipynb"
    if not path.exists():
        return None
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return sum(1 for c in cells if c["cell_type"] == "code" for o in c.get("outputs", [])
               if {"image/png", "image/svg+xml"} & set(o.get("data", {})))


class Ids(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids = set()

    def handle_starttag(self, tag, attrs):
        self.ids.update(v for k, v in attrs if k in ("id", "name") and v)


@functools.cache
def fetch(url: str) -> tuple[int, frozenset]:
    """(status, ids on the page) of a same-host URL, without its fragment."""
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            body, status = r.read(), r.status
    except urllib.error.HTTPError as e:
        return e.code, frozenset()
    parser = Ids()
    if url.split("?")[0].endswith((".html", "/")):
        parser.feed(body.decode("utf-8", errors="replace"))
    return status, frozenset(parser.ids)


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def serve(directory: Path) -> http.server.ThreadingHTTPServer:
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(directory)))
    server.daemon_threads = True
    server.timeout = 10
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                     daemon=True).start()
    return server


# What each page reports from inside the browser, after MathJax has finished (if it loaded).
PAGE_STATE = """async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
  const imgs = Array.from(document.images);
  imgs.forEach(i => { i.loading = "eager"; });
  await Promise.all(imgs.map(i => i.decode().catch(() => null)));
  const outside = el => !el.closest("pre, code, .highlight, script, style, mjx-container");
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  let text = "";
  for (let n = walker.nextNode(); n; n = walker.nextNode())
    if (outside(n.parentElement)) text += n.textContent + "\\n";
  const math = Array.from(document.querySelectorAll(".math"));
  return {
    images: imgs.length,
    broken: imgs.filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src),
    figures: document.querySelectorAll(".cell_output img").length,
    mathjax: !!window.MathJax,
    math: math.length,
    typeset: math.filter(m => m.querySelector("mjx-container")).length,
    merror: document.querySelectorAll("mjx-merror").length,
    dollars: (text.match(/\\$\\$/g) || []).length,
    traceback: document.body.innerText.includes("Traceback (most recent call last)"),
    links: Array.from(document.querySelectorAll("a[href]")).map(a => a.href),
  };
}"""


def test_book(capsys):
    sync_playwright = browser_or_skip()
    env = {k: v for k, v in os.environ.items() if k != "LAB_FULL"}  # the quick book
    build = subprocess.run([sys.executable, str(ROOT / "book" / "build.py"), "--quiet",
                            "--any-xla-flags"],  # nbmake's executions, whatever their flags
                           cwd=ROOT, env=env, capture_output=True, text=True)
    assert build.returncode == 0, f"book/build.py failed:\n{build.stdout[-4000:]}\n" \
                                  f"{build.stderr[-8000:]}"
    docs = documents()
    SHOTS.mkdir(parents=True, exist_ok=True)
    for old in SHOTS.glob("*.png"):
        old.unlink()
    problems: list[str] = []
    totals = dict(console=0, failed=0, external=0, images=0, broken=0, figures=0, expected=0,
                  links=0, anchors=0, bad_links=0, math=0, typeset=0, merror=0, dollars=0,
                  tracebacks=0)
    server = serve(HTML)
    host = f"127.0.0.1:{server.server_address[1]}"
    try:
        with sync_playwright() as p, tempfile.TemporaryDirectory(prefix="lab-book-") as profile:
            ctx = p.chromium.launch_persistent_context(
                profile, executable_path=str(CHROMIUM), args=ARGS, headless=True,
                viewport={"width": 1280, "height": 900})
            ctx.set_default_timeout(30_000)
            for doc in docs:
                url = f"http://{host}/{doc}.html"
                seen: dict[str, list[str]] = dict(console=[], failed=[], external=[])
                page = ctx.new_page()
                page.on("console", lambda m, s=seen: m.type == "error" and
                        s["console"].append(m.text))
                page.on("pageerror", lambda e, s=seen: s["console"].append(str(e)))
                page.on("requestfailed", lambda r, s=seen: s["failed"].append(
                    f"{r.url} ({r.failure})"))
                page.on("response", lambda r, s=seen: r.status >= 400 and s["failed"].append(
                    f"{r.url} ({r.status})"))
                page.on("request", lambda r, s=seen: urllib.parse.urlsplit(r.url).scheme in
                        ("http", "https", "ws", "wss") and urllib.parse.urlsplit(r.url).netloc
                        != host and s["external"].append(r.url))
                page.goto(url, wait_until="load")
                state = page.evaluate(PAGE_STATE)
                page.screenshot(path=str(SHOTS / (doc.replace("/", "__") + ".png")))
                page.close()

                for kind in ("console", "failed", "external"):
                    totals[kind] += len(seen[kind])
                    problems += [f"{doc}: {kind}: {x}" for x in seen[kind]]
                totals["images"] += state["images"]
                totals["broken"] += len(state["broken"])
                problems += [f"{doc}: image not loaded: {s}" for s in state["broken"]]
                expected = image_outputs(doc)
                if expected is not None:
                    totals["figures"] += state["figures"]
                    totals["expected"] += expected
                    if state["figures"] != expected:
                        problems.append(f"{doc}: {state['figures']} figures shown, "
                                        f"{expected} image outputs in the executed notebook")
                if state["math"]:
                    totals["math"] += state["math"]
                    totals["typeset"] += state["typeset"]
                    if not state["mathjax"] or state["typeset"] != state["math"]:
                        problems.append(f"{doc}: {state['typeset']} of {state['math']} math "
                                        f"elements typeset (MathJax loaded: {state['mathjax']})")
                totals["merror"] += state["merror"]
                totals["dollars"] += state["dollars"]
                if state["merror"] or state["dollars"]:
                    problems.append(f"{doc}: {state['merror']} MathJax errors, "
                                    f"{state['dollars']} raw $$ in the text")
                if state["traceback"]:
                    totals["tracebacks"] += 1
                    problems.append(f"{doc}: traceback text in the page")
                for link in dict.fromkeys(state["links"]):
                    parts = urllib.parse.urlsplit(link)
                    if parts.netloc != host or parts.scheme != "http":
                        continue
                    totals["links"] += 1
                    status, ids = fetch(urllib.parse.urlunsplit(parts._replace(fragment="")))
                    anchor = urllib.parse.unquote(parts.fragment)
                    if anchor:
                        totals["anchors"] += 1
                    if status != 200 or (anchor and anchor not in ids):
                        totals["bad_links"] += 1
                        problems.append(f"{doc}: link {link}: status {status}"
                                        + (f", #{anchor} missing" if anchor and status == 200
                                           else ""))
            ctx.close()
    finally:
        server.shutdown()
        server.server_close()
    for doc in docs:  # tracebacks also where a page might not show them (stderr, errors)
        path = SRC / f"{doc}.ipynb"
        if path.exists() and (TRACEBACK in path.read_text(encoding="utf-8")
                              or '"output_type": "error"' in path.read_text(encoding="utf-8")):
            problems.append(f"{doc}: the executed notebook holds an error or a traceback")
    t = totals
    with capsys.disabled():
        print(f"\nbook: {len(docs)} pages opened; console errors {t['console']}, failed "
              f"requests {t['failed']}, requests to other hosts {t['external']}; images "
              f"{t['images'] - t['broken']}/{t['images']} loaded; notebook figures "
              f"{t['figures']}/{t['expected']}; internal links {t['links'] - t['bad_links']}/"
              f"{t['links']} resolved ({t['anchors']} with anchors); math "
              f"{t['typeset']}/{t['math']} typeset, {t['merror']} errors, {t['dollars']} raw $$;"
              f" tracebacks {t['tracebacks']}; screenshots in "
              f"{SHOTS.relative_to(ROOT)}/")
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:40])
    assert len(docs) >= 12 + 4, f"only {len(docs)} pages: {docs}"
