"""No import cycle among the project's modules (refmodel/ and microbench/), read with `ast`.

Every import counts: at module level and inside functions, `importlib.import_module("literal")`
included, relative imports resolved. `from pkg import name` is an edge to the submodule
pkg.name when there is one, else to pkg's `__init__`; `import a.b` is an edge to a.b alone (the
parent packages Python runs first are not edges: a package's `__init__` importing its own
modules would otherwise make every pair of them a cycle). A cycle is two or more modules each
reachable from the other; a function-level import only defers the cycle, so it counts.
`python tests/test_import_cycles.py` prints the cycles.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("refmodel", "microbench")


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every .py under the roots (a package is its __init__)."""
    out = {}
    for root in ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _package(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _resolve(module: str, path: Path, level: int, name: str | None) -> str:
    """The absolute name of `from <level dots><name> import ...` inside `module`."""
    if level == 0:
        return name or ""
    base = _package(module, path).split(".")
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def imported(module: str, path: Path, known: set[str]) -> set[str]:
    """The project modules `module` imports anywhere in its file."""
    out: set[str] = set()

    def add(name: str) -> None:
        if name in known:
            out.add(name)

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, path, node.level, node.module)
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                add(sub if sub in known else source)
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
                   or isinstance(node.func, ast.Name) and node.func.id == "import_module")):
            name = node.args[0].value
            if name.startswith("."):
                dots = len(name) - len(name.lstrip("."))
                name = _resolve(module, path, dots, name.lstrip(".") or None)
            add(name)
    out.discard(module)
    return out


def graph() -> dict[str, set[str]]:
    files = module_files()
    return {m: imported(m, p, set(files)) for m, p in files.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of two or more modules (Tarjan), each as a
    path a -> b -> ... -> a through the component, shortest from its first module, followed
    by "(with ...)" naming the component's other modules when it has more."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:  # recursive: the graph is a few hundred modules deep at most
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    out = []
    for c in sorted(components, key=sorted):
        loop = _loop(sorted(c)[0], c, edges)
        rest = sorted(c - set(loop))  # more modules in the same knot: more loops through it
        if rest:
            loop[-1] += f" (with {', '.join(rest)})"
        out.append(loop)
    return out


def _loop(start: str, component: set[str], edges: dict[str, set[str]]) -> list[str]:
    """The shortest path start -> ... -> start inside the component (breadth first)."""
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges[v] & component):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if w not in previous:
                    previous[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{start} is on no cycle")


def test_resolves_relative_and_submodule_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import a\n")
    (pkg / "a.py").write_text("from .sub import b\nimport importlib\n"
                              "def f():\n    importlib.import_module('pkg.sub')\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("from ..a import f\nfrom pkg import name_in_init\n")
    known = {"pkg", "pkg.a", "pkg.sub", "pkg.sub.b"}
    assert imported("pkg", pkg / "__init__.py", known) == {"pkg.a"}
    assert imported("pkg.a", pkg / "a.py", known) == {"pkg.sub.b", "pkg.sub"}
    assert imported("pkg.sub.b", pkg / "sub" / "b.py", known) == {"pkg.a", "pkg"}
    edges = {"pkg": {"pkg.a"}, "pkg.a": {"pkg.sub.b", "pkg.sub"}, "pkg.sub": set(),
             "pkg.sub.b": {"pkg.a", "pkg"}}
    assert cycles(edges) == [["pkg", "pkg.a", "pkg.sub.b", "pkg"]]


@pytest.mark.parametrize("root", ROOTS)
def test_no_import_cycle(root):
    found = [c for c in cycles(graph()) if any(m.partition(".")[0] == root for m in c)]
    assert not found, f"{len(found)} import cycle(s) through {root}/:\n" + "\n".join(
        " -> ".join(c) for c in found)


if __name__ == "__main__":
    for loop in cycles(graph()):
        print(" -> ".join(loop))
    sys.exit(0)
