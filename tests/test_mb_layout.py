"""The shape of microbench/: no function longer than MAX_LINES (def or async def, nested ones
included, counted from `def` to its last line), and every module in the package for its kind
of work (roofs/, phases/, studies/, plots/, commands/) or in the shared core beside them."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "microbench"
MAX_LINES = 60
# What stays at the top of microbench/: the shared core every subpackage uses.
CORE = {"__init__", "__main__", "blas", "cli", "files", "hardware", "harness", "machines",
        "roofline", "schema", "sysinfo"}
SUBPACKAGES = {"roofs", "phases", "studies", "plots", "commands"}


def long_functions(root: Path, limit: int = MAX_LINES) -> list[str]:
    """'path:line name (N lines)' for every function under root longer than limit."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} "
                                 f"{node.name} ({lines} lines)")
    return found


def test_the_walk_finds_nested_and_async_functions(tmp_path):
    body = "\n".join(f"        x{i} = {i}" for i in range(61))
    (tmp_path / "m.py").write_text(f"def outer():\n    async def inner():\n{body}\n"
                                   f"    return inner\n\n\ndef short():\n    return 1\n")
    found = long_functions(tmp_path)
    assert [f.split(" ", 1)[1] for f in found] == ["outer (64 lines)", "inner (62 lines)"]


def test_no_function_is_longer_than_60_lines():
    found = long_functions(PACKAGE)
    assert not found, f"{len(found)} function(s) over {MAX_LINES} lines:\n" + "\n".join(found)


def test_every_module_sits_in_its_package():
    top = {p.stem for p in PACKAGE.glob("*.py")}
    assert top == CORE, f"modules outside the core and the subpackages: {sorted(top - CORE)}"
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert packages == SUBPACKAGES
    for name in SUBPACKAGES:  # each says what it holds, file by file
        doc = ast.get_docstring(ast.parse((PACKAGE / name / "__init__.py").read_text())) or ""
        missing = [p.stem for p in (PACKAGE / name).glob("*.py")
                   if p.stem != "__init__" and f"{p.stem}.py" not in doc]
        assert not missing, f"microbench/{name}/__init__.py does not name {missing}"
