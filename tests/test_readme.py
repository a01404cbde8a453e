"""The README is for users: short, two commands, results generated from the saved data, no
run history, every link resolving, and a license the package metadata names."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

from microbench.plots import results

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_the_readme_fits_a_few_screens():
    assert len(README.splitlines()) < 250


def test_it_holds_exactly_the_two_commands_each_from_a_fresh_clone():
    commands = [line for line in README.splitlines() if line.startswith("python3 -m venv")]
    assert len(commands) == 2, commands
    main, tests = commands
    assert main.endswith("python -m microbench run")
    assert "pytest" in tests and "book/test_book.py" in tests  # the book is tested too


def test_the_results_table_is_the_one_the_saved_data_give():
    """Regenerate with `python -m microbench.plots.results` and paste between the markers."""
    block = re.search(r"<!-- results:start -->\n(.*?)<!-- results:end -->", README, re.S)
    assert block, "README has no results block"
    assert block.group(1) == results.table(ROOT / "figures" / "data")


def test_every_row_names_its_machine_date_and_backend():
    table = results.table(ROOT / "figures" / "data")
    rows = table.splitlines()[2:]
    assert len(rows) >= 5
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        machine, date, backend = cells[-3:]
        assert re.search(r"family \d+ model \d+ \(.+\), \d+ cores", machine), row
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", date), row
        assert backend.startswith("cpu"), row


def test_no_run_history_or_process_words():
    history = [r"\b\d{1,2}:\d{2} UTC", r"\b\d+ min \d+ s\b", r"\bsession", r"\bissue \d+",
               r"\bthe issue\b", r"\bworkplace\b", r"\bthe brief\b", r"\d{4}-\d{2}-\d{2}[^|]*run"]
    text = re.sub(r"<!-- results:start -->.*?<!-- results:end -->", "", README, flags=re.S)
    found = [(p, m.group(0)) for p in history for m in re.finditer(p, text, re.I)]
    assert not found, found


def test_every_relative_link_resolves():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    missing = [link for link in links if "://" not in link and not (ROOT / link).exists()]
    assert not missing, missing


def test_the_license_exists_and_the_package_names_it():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["license"] == "MIT" and meta["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
