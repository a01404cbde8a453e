"""Build the book: the twelve notebooks executed, with their outputs and figures inline, the
method, the committed results and the reading order, as a static site that loads nothing from
the network (Jupyter Book 1.x: Sphinx, myst-nb and sphinx-book-theme; MathJax served from the
site by sphinx-mathjax-offline).

    .venv/bin/python book/build.py           # quick mode (what the tests run), build/book/html/
    .venv/bin/python book/build.py --full    # LAB_FULL=1: the notebooks at publication size

Executed on your machine, the book is your own lab manual. A notebook is executed only when its
executed copy (`build/book/executed/`, written by this script or by the test run's nbmake, see
`book/nbcache.py` and the root `conftest.py`) is missing or stale (other code cells, another
mode or other XLA flags), one at a time (four of them time this machine, and a neighbour would
lower what they measure). A markdown edit executes nothing. The committed notebooks
are never written to: the copies are executed, and the book is made from them. Sphinx then
rebuilds only the pages whose staged source changed, so a rebuild after a text edit is fast.
The explorer page (book/explorer_page.py) is staged with its data, counted by refmodel.costs
when refmodel/ changed since the last build (about 25 CPU-seconds), else reused.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import explorer_page  # noqa: E402  (book/explorer_page.py: the explorer page and its data)
import nbcache  # noqa: E402  (book/nbcache.py, beside this file)

BOOK = nbcache.ROOT / "book"
FIGURES = nbcache.ROOT / "figures"
OUT = nbcache.OUT
SRC = OUT / "src"  # the staged sources: the repository's layout, so relative links resolve
HTML = OUT / "html"
AS_IS = ("index.md", "method.md", "reading_order.md", "_config.yml", "offline.py", "favicon.svg")
# A results page per figures/<machine>/<study>.md; its figures are <study>.png and
# <study>_*.png of the same folder, and the summary of the roofs and phases (summary.md) takes
# the figures no other study claims. Titles for the summaries that have no heading of their own.
TITLES = {"summary": "Roofs and phases", "decode": "The decode race", "serve": "Serving",
          "simulate": "Serving at scale", "speculative": "Speculative decoding",
          "quant": "Quantization", "parallel": "Parallelism", "collectives": "Collectives"}


def write(path: Path, content: str | bytes) -> None:
    """Write only what changed: Sphinx rebuilds a page whose source is newer than its doctree."""
    data = content.encode() if isinstance(content, str) else content
    if path.exists() and path.read_bytes() == data:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def execute(name: str, run_mode: str) -> Path:
    """Execute notebooks/<name>.ipynb (a copy in memory, cwd notebooks/ as nbmake runs it) and
    store it; raise on the first failing cell."""
    import nbformat
    from nbclient import NotebookClient

    source = nbcache.NOTEBOOKS / f"{name}.ipynb"
    nb = nbformat.read(source, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
    t0 = time.perf_counter()
    print(f"executing {source.relative_to(nbcache.ROOT)} ({run_mode}) ...", flush=True)
    NotebookClient(nb, timeout=1800, record_timing=True,
                   resources={"metadata": {"path": str(nbcache.NOTEBOOKS)}}).execute()
    print(f"  {time.perf_counter() - t0:.0f} s", flush=True)
    return nbcache.store(nb, source, run_mode, executed_by="book/build.py")


def executed(run_mode: str, fresh: bool, any_flags: bool) -> dict[str, Path]:
    """The executed copy of every notebook, reusing current ones unless `fresh`."""
    os.environ["LAB_FULL"] = "1" if run_mode == "full" else "0"  # the kernels inherit it
    names = sorted(p.stem for p in nbcache.NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    copies, reused = {}, []
    for name in names:
        copy = None if fresh else nbcache.stored(name, run_mode, any_flags)
        if copy is not None:
            reused.append(name)
        copies[name] = copy or execute(name, run_mode)
    if reused:
        print(f"reused {len(reused)} of {len(names)} executed notebooks ({run_mode} mode, "
              f"{nbcache.executed_dir(run_mode).relative_to(nbcache.ROOT)}/)")
    return copies


def figure_order() -> list[str]:
    """The roofs-and-phases figures in the order microbench.plots lists them (roofs, then
    phases); alphabetical where that module cannot be read."""
    try:
        from microbench.plots import FIGURES as drawn
    except Exception:  # the book does not fail because a plotting module does
        return []
    return [f"{name}.png" for name in drawn]


def machine_folders() -> list[str]:
    """The machines whose figures are committed: figures/<machine>/ beside figures/data/."""
    return sorted(p.name for p in FIGURES.iterdir() if p.is_dir() and p.name != "data"
                  and any(p.glob("*.md")))


def study_figures(machine: str) -> dict[str, list[str]]:
    """figures/<machine>/<study>.md -> the PNGs it summarises (every PNG on exactly one page),
    the roofs and phases (summary.md) first."""
    folder = FIGURES / machine
    studies = sorted((p.stem for p in folder.glob("*.md")), key=lambda s: (s != "summary", s))
    pngs = sorted(p.name for p in folder.glob("*.png"))
    owned = {s: [p for p in pngs if p == f"{s}.png" or p.startswith(f"{s}_")] for s in studies}
    claimed = {p for ps in owned.values() for p in ps}
    if "summary" in owned:
        order = figure_order()
        rest = [p for p in pngs if p not in claimed]
        owned["summary"] += sorted(rest, key=lambda p: (order.index(p) if p in order
                                                         else len(order), p))
    return owned


def results_page(machine: str, study: str, pngs: list[str]) -> str:
    """A page with a short title, the study's figures, then figures/<machine>/<study>.md
    included, its own headings one level down."""
    where = f"figures/{machine}"
    text = (FIGURES / machine / f"{study}.md").read_text(encoding="utf-8")
    has_title = text.startswith("# ")
    title = TITLES.get(study) or (text.splitlines()[0][2:] if has_title else study.capitalize())
    figures = "".join(f"```{{figure}} ../../{where}/{p}\n:alt: {p}\n:width: 100%\n\n"
                      f"`{where}/{p}`\n```\n\n" for p in pngs)
    return (f"# {title}\n\n*The committed run's summary, `{where}/{study}.md`, and its "
            f"figures; `python -m microbench figures` redraws them from "
            f"`figures/data/{machine}/`.*\n\n"
            f"{figures}```{{include}} ../../{where}/{study}.md\n"
            + (":heading-offset: 1\n" if has_title else "") + "```\n")


def results_index(owned: dict[str, dict[str, list[str]]]) -> str:
    rows = "".join(f"- [{TITLES.get(s, s.capitalize())}]({m}/{s}.md): `figures/{m}/{s}.md`, "
                   f"{len(ps)} figure{'s' * (len(ps) != 1)}\n"
                   for m, studies in owned.items() for s, ps in studies.items())
    return ("# Results on the reference machines\n\n"
            "What the committed runs in `figures/data/<machine>/` showed, each on the machine "
            "it names (the README's table, included as it is):\n\n"
            "```{include} ../README.md\n:start-after: <!-- results:start -->\n"
            ":end-before: <!-- results:end -->\n```\n\n"
            f"One page per study and machine, its summary and its figures:\n\n{rows}")


def toc(names: list[str], studies: list[str]) -> str:
    chapters = "".join(f"      - file: notebooks/{n}\n" for n in names)
    sections = "".join(f"          - file: results/{s}\n" for s in studies)
    return ("# Generated by book/build.py from notebooks/*.ipynb and figures/*.md.\n"
            "format: jb-book\nroot: index\nparts:\n"
            f"  - caption: Notebooks\n    chapters:\n{chapters}"
            "  - caption: Explore\n    chapters:\n      - file: explorer\n"
            "  - caption: Results\n    chapters:\n      - file: results/index\n"
            f"        sections:\n{sections}"
            "  - caption: Method and code\n    chapters:\n"
            "      - file: method\n      - file: reading_order\n")


def link_fixes(text: str) -> str:
    """Links in a notebook's markdown, as written for the repository, made right in the book:
    a notebook's text twin (NN_name.py) is its page, a figures/<machine>/<study>.md its results
    page, book/explorer.md (the explorer's template) the explorer."""
    text = re.sub(r"\]\((\d\d_[A-Za-z0-9_]+)\.py(#[^)]*)?\)", r"](\1.ipynb\2)", text)
    text = text.replace("](../book/explorer.md)", "](../explorer.md)")  # its template -> the page
    return re.sub(r"\]\(\.\./figures/([A-Za-z0-9_.-]+)/([A-Za-z0-9_]+)\.md(#[^)]*)?\)",
                  r"](../results/\1/\2.md\3)", text)


def merged(name: str, path: Path):
    """The notebook as it is now, each code cell with the outputs of its executed copy (the
    key covers every code cell, so they pair one to one), links made right for the book."""
    import nbformat

    nb = nbformat.read(nbcache.NOTEBOOKS / f"{name}.ipynb", as_version=4)
    ran = nbformat.read(path, as_version=4)
    outputs = iter([c for c in ran.cells if c.cell_type == "code"])
    for cell in nb.cells:
        if cell.cell_type == "code":
            done = next(outputs)
            cell.outputs, cell.execution_count = done.outputs, done.execution_count
        elif cell.cell_type == "markdown":
            cell.source = link_fixes(cell.source)
    nb.metadata = ran.metadata  # the kernel's language_info, the copy's key
    return nb


def this_build(run_mode: str, copies: dict[str, Path]) -> str:
    import nbformat

    rows = []
    for name, path in copies.items():
        meta = nbformat.read(path, as_version=4).metadata.get("lab_book", {})
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(path.stat().st_mtime))
        flags = meta.get("xla_flags", "")
        flags = "default" if not flags else "the tests' (optimisations off: slower than " \
            "this machine)" if "optimization_level=0" in flags else f"`{flags}`"
        rows.append(f"| [{name}](notebooks/{name}.ipynb) | {meta.get('executed_by', '?')} "
                    f"| {when} | {flags} |\n")
    flag = "`LAB_FULL=1`, publication size" if run_mode == "full" else \
        "`LAB_FULL` unset: small sizes, short budgets, as the tests run them"
    return (f"**{run_mode.capitalize()} mode** ({flag}), executed on the machine that built it.\n\n"
            "| notebook | executed by | at | XLA flags |\n|---|---|---|---|\n" + "".join(rows))


def stage(run_mode: str, copies: dict[str, Path]) -> None:
    """Lay out build/book/src/ like the repository (README.md, figures/, notebooks/) plus the
    book's pages, touching only files whose content changed, and removing what is gone."""
    import nbformat

    wanted: set[Path] = set()

    def put(rel: str, content: str | bytes) -> None:
        write(SRC / rel, content)
        wanted.add(SRC / rel)

    for page in AS_IS:  # from book/, as they are
        put(page, (BOOK / page).read_bytes())
    put("README.md", (nbcache.ROOT / "README.md").read_bytes())  # included by two pages
    put("_this_build.md", this_build(run_mode, copies))
    for name, path in copies.items():
        put(f"notebooks/{name}.ipynb", nbformat.writes(merged(name, path)) + "\n")
    owned = {m: study_figures(m) for m in machine_folders()}
    for machine in owned:
        folder = FIGURES / machine
        for f in sorted(folder.glob("*.png")) + sorted(folder.glob("*.md")):
            put(f"figures/{machine}/{f.name}", f.read_bytes())
        for study, pngs in owned[machine].items():
            put(f"results/{machine}/{study}.md", results_page(machine, study, pngs))
    put("results/index.md", results_index(owned))
    for rel, content in explorer_page.files(OUT / "explorer-counts.json").items():
        put(rel, content)  # the page, and _explorer/: served as _static/ (_config.yml)
    put("_toc.yml", toc(list(copies), [f"{m}/{s}" for m in owned for s in owned[m]]))
    for path in sorted(SRC.rglob("*"), reverse=True):  # files first, then emptied folders
        if path.is_file() and path not in wanted:
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()


EXTERNAL = re.compile(r"""<(?:script|img|iframe|source)\b[^>]*\bsrc=["'](?:https?:)?//"""
                      r"""|<link\b[^>]*\bhref=["'](?:https?:)?//[^>]*>""", re.I)
CSS_EXTERNAL = re.compile(r"""url\(\s*["']?(?:https?:)?//""", re.I)


def external_loads(html: Path) -> list[str]:
    """Every script, stylesheet, font, image or frame the built site would fetch from another
    host (a <link> to another host counts unless it is rel=canonical, which loads nothing)."""
    found = []
    for page in sorted(html.rglob("*.html")):
        for m in EXTERNAL.finditer(page.read_text(encoding="utf-8", errors="replace")):
            if "canonical" not in m.group(0):
                found.append(f"{page.relative_to(html)}: {m.group(0)[:120]}")
    for css in sorted(html.rglob("*.css")):
        if CSS_EXTERNAL.search(css.read_text(encoding="utf-8", errors="replace")):
            found.append(f"{css.relative_to(html)}: url(//...)")
    return found


def sphinx(quiet: bool) -> None:
    """Jupyter Book 1.x's Sphinx build, warnings as errors (a broken include, link or
    figure fails the build instead of leaving a hole in a page)."""
    from jupyter_book.sphinx import build_sphinx

    result = build_sphinx(SRC, HTML, noconfig=True, path_config=SRC / "_config.yml",
                          confoverrides={"external_toc_path": (SRC / "_toc.yml").as_posix(),
                                         "latex_individualpages": False},
                          doctreedir=OUT / "doctrees", warningiserror=True, keep_going=True,
                          quiet=quiet)
    if result:
        raise SystemExit(f"book/build.py: the Sphinx build failed ({result}); see above")


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true",
                    help="run the notebooks at publication size (LAB_FULL=1; long)")
    ap.add_argument("--fresh", action="store_true",
                    help="execute every notebook again, even where a current copy exists "
                         "(the cache key is the notebook's source, not the library's)")
    ap.add_argument("--any-xla-flags", action="store_true",
                    help="reuse executed copies whatever XLA flags they ran under (the test "
                         "run's book: nbmake ran most notebooks beside the tests, whose XLA "
                         "flags turn optimisations off; their timings are not this machine's)")
    ap.add_argument("--clean", action="store_true", help="rebuild every page (not only changed)")
    ap.add_argument("-q", "--quiet", action="store_true", help="only warnings and the result")
    args = ap.parse_args(argv)
    run_mode = "full" if args.full else "quick"
    t0 = time.perf_counter()
    copies = executed(run_mode, args.fresh, args.any_xla_flags)
    if args.clean:
        shutil.rmtree(HTML, ignore_errors=True)
        shutil.rmtree(OUT / "doctrees", ignore_errors=True)
    stage(run_mode, copies)
    sphinx(args.quiet)
    external = external_loads(HTML)
    if external:
        raise SystemExit("book/build.py: the site loads from other hosts:\n  "
                         + "\n  ".join(external))
    index = HTML / "index.html"
    print(f"book built in {time.perf_counter() - t0:.0f} s ({run_mode} mode): {index}")
    return index


if __name__ == "__main__":
    main()
