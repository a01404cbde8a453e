"""Words for the reader, not a lab diary (house style, rule 24): the source speaks of the
project, never of how it was made, and keeps no log of past runs; history lives in git.

Scanned: the hand-written source under refmodel/, microbench/ and tests/ and the notebooks'
notebooks/*.py (.py, .cc, .h), and the generated figure text figures/*.md.

1. Process words, anywhere in a file (code, strings, comments): words for the stretch of
   work a change was made in, for the place it was made in, for a task's written
   instructions or for the one who was handed them, and an issue of the tracker by number or
   as "the" issue (the list: PROCESS below). Figure text is rendered from the benchmarks' own
   strings, so it is checked for these too.
2. In the comments and docstrings of source files (a notebook's markdown cells are comments):
   a calendar date (YYYY-MM-DD), a clock time naming a run (hh:mm followed by "run"), and a
   machine's name (Zen 3/4/5, Xeon, EPYC) on a line that also gives a measurement (a number
   with a unit of time, of something per second, GHz, %, a ratio "x"; a "->" between two
   numbers; "measured" before a number) or beside such a line in the same comment. A
   machine's name alone (a microarchitecture table's note on how wide its vector units are)
   is a fact about the hardware, not a run log, and stays.
   The allow rule, for dates only: a line that cites a source (an arXiv id, "et al.", a URL,
   a DOI, a datasheet, a spec sheet, a paper) keeps its date, part of the reference.
   Dates and machine names in code and data (a fixture's "date_utc", a CPU-model table) are
   not comments and are not checked, nor is figures/*.md for them: a figure's text names the
   machine and the date from its result file's environment block, on purpose.

Each failure lists every offending file:line. The patterns are built from pieces so that this
file does not match itself, and it is scanned like any other.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCE_DIRS = ("refmodel", "microbench", "tests")
SUFFIXES = (".py", ".cc", ".h")

_S = "ses" + "sion"
_W = "work" + "place"
_B = "bri" + "ef"
_I = "iss" + "ue"
_H = "hel" + "per"
PROCESS = [
    (re.compile(rf"\b{_S}s?\b", re.I), f"'{_S}': the project has none"),
    (re.compile(rf"\b{_W}s?\b", re.I), f"'{_W}'"),
    (re.compile(rf"\b(?:the|this|that|my|your|our|a) {_B}\b|\b{_B}(?:'s| says| asks)",
                re.I), f"'{_B}' as a task"),
    (re.compile(rf"\b{_H}(?:'s|s')? (?:{_S}|agent|brief|report)s?\b|\bthe {_H}\b"
                r"(?! (?:function|method|class|module|thread))", re.I), f"'{_H}' as a person"),
    (re.compile(rf"\b{_I}s? ?#?\d+", re.I), f"an {_I} by number"),
    (re.compile(rf"\b(?:the|this|that) {_I}(?:'s)?\b", re.I), f"'the {_I}'"),
]
DATE = re.compile(r"\b(?:19|20)\d\d-[01]\d-[0-3]\d\b")
CLOCK_RUN = re.compile(r"\b[0-2]?\d:[0-5]\d(?: UTC)? runs?\b")
MACHINE = re.compile(r"\bZen ?[1-9]\b|\bXeon\b|\bEPYC\b", re.I)
MEASUREMENT = re.compile(
    r"\d(?:[\d.,]*\d)?\s*(?:ms|us|µs|ns|s|sec|min|GHz|%|x|(?:[A-Za-z]+ )?[A-Za-z]*/s)(?![\w/])"
    r"|\d\s*->\s*\d|\bmeasured\b\D{0,40}\d", re.I)
CITATION = re.compile(r"arxiv|et al\.|https?://|doi|datasheet|data sheet|spec sheet|paper",
                      re.I)


def sources() -> list[Path]:
    files = [p for d in SOURCE_DIRS for p in sorted((ROOT / d).rglob("*"))
             if p.suffix in SUFFIXES and p.is_file()]
    return files + sorted((ROOT / "notebooks").glob("*.py"))


def figure_texts() -> list[Path]:
    return sorted((ROOT / "figures").glob("*/*.md"))


def comment_lines(path: Path, text: str) -> dict[int, str]:
    """line number -> the comment or docstring text on it (several on one line joined)."""
    out: dict[int, str] = {}

    def add(line: int, s: str) -> None:
        out[line] = f"{out[line]} {s}" if line in out else s

    if path.suffix == ".py":
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                add(tok.start[0], tok.string)
        for node in ast.walk(ast.parse(text)):
            if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                    and isinstance(node.value.value, str)):  # a docstring or bare string
                for i, s in enumerate(text.splitlines()[node.lineno - 1:node.end_lineno]):
                    add(node.lineno + i, s)
    else:  # C++: // to the end of the line, /* ... */ across lines (no string is a comment)
        code = re.sub(r'"(?:\\.|[^"\\\n])*"', lambda m: " " * len(m.group(0)), text)
        for m in re.finditer(r"//[^\n]*|/\*.*?\*/", code, re.S):
            first = code.count("\n", 0, m.start()) + 1
            for i, s in enumerate(text[m.start():m.end()].splitlines()):
                add(first + i, s)
    return out


def process_words(text: str) -> list[tuple[int, str]]:
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        for pattern, what in PROCESS:
            if m := pattern.search(line):
                found.append((n, f"{what}: {m.group(0)!r}"))
    return found


def run_logs(path: Path, text: str) -> list[tuple[int, str]]:
    comments = comment_lines(path, text)
    found = []
    for n, line in sorted(comments.items()):
        near = " ".join(comments.get(i, "") for i in (n - 1, n, n + 1))
        if (m := DATE.search(line)) and not CITATION.search(line):
            found.append((n, f"a date in a comment: {m.group(0)!r}"))
        elif m := CLOCK_RUN.search(line):
            found.append((n, f"a run by its clock time: {m.group(0)!r}"))
        elif (m := MACHINE.search(line)) and MEASUREMENT.search(near):
            found.append((n, f"a machine next to a measurement: {m.group(0)!r}"))
    return found


def _report(hits: list[tuple[Path, int, str]]) -> str:
    return f"{len(hits)} lines:\n" + "\n".join(
        f"{p.relative_to(ROOT)}:{n}: {what}" for p, n, what in hits)


def test_no_process_words_in_the_source_or_the_figures():
    hits = [(p, n, what) for p in sources() + figure_texts()
            for n, what in process_words(p.read_text())]
    assert not hits, _report(hits)


def test_no_dated_run_logs_in_comments():
    hits = [(p, n, what) for p in sources() for n, what in run_logs(p, p.read_text())]
    assert not hits, _report(hits)


# The checks above can fail: each rule is shown to catch what it names, and to let pass what
# the docstring allows.
@pytest.mark.parametrize("line,caught", [
    (f"# as the {_B} asks", True),
    (f"# kept from an earlier {_S}", True),
    (f"# this {_W}'s VMs", True),
    (f"# targets ({_I} 18)", True),
    (f"# Targets ({_I}s 6 and 10)", True),
    (f"# the {_I}'s goal", True),
    (f"# one {_H} {_S} per task", True),
    (f"# shared {_H}s: the tiny config", False),
    (f"# a {_H} function for the tests", False),
    ("# an HTTP-free cache, brief and plain", False),
])
def test_process_word_rule(line, caught):
    assert bool(process_words(line)) is caught


@pytest.mark.parametrize("src,caught", [
    ("# a 2-core Zen 4, 8 rows 32.9 ms\nx = 1\n", True),
    ("# on a Xeon (KVM):\n# 0.95 -> 0.97 of the read\nx = 1\n", True),
    ("# measured 2026-12-03\nx = 1\n", True),
    ('"""The 21:57 run of the code."""\n', True),
    ('"""Docs.\n\nOn an EPYC the product ran at 120 GFLOP/s.\n"""\n', True),
    ("# a 2-core Zen 4: 0.75 in place\n# (the same machine measured 0.87-0.97)\n", True),
    ("# Zen 4 executes 512-bit work as two 256-bit halves\nx = 1\n", False),
    ('"""machine: a label ("cpu: AMD EPYC, 2 cores")\nquick: measured with --quick"""\n',
     False),
    ("# FlashAttention (Dao et al., 2022-05-27): tiles in SRAM\nx = 1\n", False),
    ("# H100 datasheet, 2023-03-21: 3.35 TB/s\nx = 1\n", False),
    ('d = {"date_utc": "2026-11-30", "cpu": "Zen 4", "s": "5 ms"}\n', False),
])
def test_run_log_rule_py(src, caught):
    assert bool(run_logs(Path("x.py"), src)) is caught


@pytest.mark.parametrize("src,caught", [
    ("int x;  // a 2-core Zen 5: 133-164 GFLOP/s\n", True),
    ("/* Tried on a Xeon,\n   8 rows 17.9 -> 26.4 GB/s */\nint x;\n", True),
    ("// measured 2026-12-04\n", True),
    ("// AVX-512 (Zen 4 and later) and AVX2\n", False),
    ('const char* s = "Zen 4 at 5 ms";  // a string, not a comment\n', False),
])
def test_run_log_rule_cc(src, caught):
    assert bool(run_logs(Path("x.cc"), src)) is caught


def test_scan_covers_every_area():
    names = {p.relative_to(ROOT).parts[0] for p in sources()}
    assert names == {"refmodel", "microbench", "tests", "notebooks"}
    assert any(p.suffix == ".cc" for p in sources()) and any(p.suffix == ".h" for p in sources())
    assert Path(__file__).resolve() in sources() and figure_texts()
