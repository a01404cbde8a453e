"""One shape letter, one meaning: the alphabet in `refmodel.shapes` is the one the package's
docstring shows, the only one its shape comments, einsum strings and native kernels use, and
each letter is used for what it is declared to mean, as far as a scan can tell:

- presence: every capital standing alone in a shape bracket of a comment (Python and C++), in
  a C++ string (the kernels' error messages), in an einsum string, and every one-capital
  identifier of the C++ code (a size, or a template's type, declared `typename`) is a letter of
  `SHAPE_LETTERS`;
- parts: a letter that is a product of others (`PARTS`: N = K G, M = G T) never shares one
  shape with its parts, so the BLAS `x [M, K] @ w [K, N]` (K inputs, N outputs) fails: here K
  and N are heads;
- bindings: a letter bound to a config field (`D = cfg.d_model`) is that field's letter in
  `FIELDS`, and every field has one letter;
- tables: GLOBAL and VARIANT are disjoint (no letter declared twice), PARTS and FIELDS use
  declared letters only.
"""

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

import refmodel
from refmodel.shapes import FIELDS, GLOBAL, PARTS, SHAPE_LETTERS, VARIANT

PACKAGE = Path(refmodel.__file__).parent
# A bracket of shape text: letters, digits, spaces, commas, + - * / ( ), and `...`, `_` (so
# `[max_position, D]` and `[B, T, ...]` count; `x[t, s]` counts too but has no capital).
BRACKET = re.compile(r"\[([A-Za-z0-9_ ,+\-*/().]*)\]")
LETTER = re.compile(r"(?<![A-Za-z0-9_])[A-Z](?![A-Za-z0-9_])")  # a capital standing alone
CPP_COMMENT_OR_STRING = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"', re.S)


def docstring_tables() -> dict[str, str]:
    """The indented `X meaning` cells of the alphabet blocks of refmodel's docstring."""
    doc = refmodel.__doc__
    text = doc[doc.index("Shape alphabet"):doc.index("Public API")]
    cells = {}
    for line in text.splitlines():
        if not line.startswith("    "):
            continue
        for cell in re.split(r"\s{2,}", line.strip()):
            letter, _, meaning = cell.partition(" ")
            assert len(letter) == 1 and letter.isupper(), f"not a letter cell: {cell!r}"
            assert letter not in cells, f"{letter} twice in the docstring"
            cells[letter] = meaning
    return cells


def _brackets(text: str, line: int, found: set) -> None:
    for m in BRACKET.finditer(text):
        letters = LETTER.findall(m.group(1))
        if letters:
            found.add((line, "".join(letters), m.group(0)))


def shapes_of(path_or_name: str, source: str) -> set[tuple[int, str, str]]:
    """(line, letters, where) for every shape a file writes: the lone capitals of a bracket in
    a comment (and, in C++, in a string), of each operand of an einsum call, and in C++ each
    one-capital identifier of the code (letters: that one)."""
    found: set = set()
    if str(path_or_name).endswith((".cc", ".h")):
        typenames = set(re.findall(r"typename\s+([A-Z])\b", source))
        for m in CPP_COMMENT_OR_STRING.finditer(source):
            first = source.count("\n", 0, m.start()) + 1
            for i, text in enumerate(m.group(0).splitlines()):
                _brackets(text, first + i, found)
        code = CPP_COMMENT_OR_STRING.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), source)
        for n, text in enumerate(code.splitlines(), 1):
            for name in re.findall(r"\b[A-Z]\b", text):
                if name not in typenames:
                    found.add((n, name, "identifier"))
        return found
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            _brackets(tok.string, tok.start[0], found)
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "einsum" and node.args
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            for operand in re.split(r",|->", node.args[0].value):
                if letters := re.findall(r"[A-Z]", operand):
                    found.add((node.lineno, "".join(letters), node.args[0].value))
    return found


def parts_clashes(shapes) -> list[tuple[int, str, str]]:
    """The shapes that hold a product letter together with one of its parts."""
    return [(line, letters, where) for line, letters, where in shapes
            for whole, parts in PARTS.items() if whole in letters and set(parts) & set(letters)]


def bindings(source: str) -> list[tuple[int, str, str]]:
    """(line, letter, field) for every `X = cfg.field` (or `X, Y = cfg.a, cfg.b`; `cfg`,
    `config`, `self.cfg`, `model.cfg`, ...: an attribute of a name ending in cfg or config)."""
    def field(value) -> str | None:
        if isinstance(value, ast.Attribute):
            base = value.value
            name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
            if name.endswith(("cfg", "config")):
                return value.attr
        return None

    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target, value = node.targets[0], node.value
        pairs = ([(target, value)] if isinstance(target, ast.Name) else
                 list(zip(target.elts, value.elts, strict=False))
                 if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) else [])
        for t, v in pairs:
            if (isinstance(t, ast.Name) and len(t.id) == 1 and t.id.isupper()
                    and (f := field(v)) is not None):
                out.append((node.lineno, t.id, f))
    return out


FIELD_LETTER = {f: letter for letter, fields in FIELDS.items() for f in fields}


def wrong_bindings(source: str) -> list[tuple[int, str, str]]:
    return [(line, letter, f) for line, letter, f in bindings(source)
            if FIELD_LETTER.get(f) != letter]


def test_tables_are_disjoint_and_single_letters():
    assert not set(GLOBAL) & set(VARIANT)
    assert all(len(k) == 1 and k.isupper() for k in SHAPE_LETTERS)
    assert SHAPE_LETTERS == {**GLOBAL, **VARIANT}
    assert all(set(whole + parts) <= set(SHAPE_LETTERS) for whole, parts in PARTS.items())
    assert set(FIELDS) <= set(SHAPE_LETTERS)
    every = [f for fields in FIELDS.values() for f in fields]
    assert len(every) == len(set(every)), "a config field declared for two letters"


def test_fields_are_config_fields():
    cfg = refmodel.presets.get("tiny")
    for letter, fields in FIELDS.items():
        for f in fields:
            assert hasattr(cfg, f), f"FIELDS[{letter!r}]: ModelConfig has no {f!r}"


def test_docstring_mirrors_shape_letters():
    assert docstring_tables() == SHAPE_LETTERS


def test_scanner_sees_comments_and_einsums():
    """The checks below can fail: an unknown letter in either place is found."""
    src = ('import jax.numpy as jnp\n'
           'y = x  # [B, O, max_position]: not a letter of ours\n'
           'z = jnp.einsum("BOH,BH->BO", a, b)  # x[t, s] has no capital\n'
           's = "[B, O] in a string is not a comment"\n')
    letters = {(line, letter) for line, letters, _ in shapes_of("x.py", src) for letter in letters}
    assert letters == {(2, "B"), (2, "O"), (3, "B"), (3, "O"), (3, "H")}


def test_scanner_sees_cpp_comments_strings_and_identifiers():
    src = ('// x [M, K] times w [K, N]\n'
           'template <int B, typename T>\n'
           'static void f(const T* w, int64_t O) {\n'
           '  if (O < 1) throw "f: w [O, H]";  /* [P, page] */\n'
           '}\n')
    got = {(line, letters) for line, letters, _ in shapes_of("x.cc", src)}
    assert got == {(1, "MK"), (1, "KN"), (2, "B"), (3, "O"), (4, "O"), (4, "OH"), (4, "P")}


def test_parts_rule_catches_the_blas_letters():
    """`# [M, K, N]` (BLAS: rows, inputs, outputs) puts query heads beside their KV heads."""
    for name, src in (("x.py", "y = x @ w  # x [M, K] @ w [K, N] -> [M, N]\n"),
                      ("x.py", "y = x  # [M, K, N]\n"),
                      ("x.cc", "// x [M, K], w [K, N], y [M, N]\n"),
                      ("x.py", 'import jax.numpy as jnp\ny = jnp.einsum("BKN,BN->BK", a, b)\n'),
                      ("x.py", "y = x  # [B, K, M, T]: M = G T already\n")):
        assert parts_clashes(shapes_of(name, src)), src
    for name, src in (("x.py", "y = x  # [B, T, N, H] and [B, T, K, G, H]\n"),
                      ("x.py", "y = x  # [B, K, M, H]\n"),
                      ("x.cc", "// x [M, n_in], w [n_in, n_out], y [M, n_out]\n")):
        assert not parts_clashes(shapes_of(name, src)), src


def test_binding_rule_catches_a_wrong_field():
    src = ("D, N, K = cfg.d_model, cfg.n_heads, self.cfg.n_kv_heads\n"
           "H = config.resolved_head_dim\n")
    assert bindings(src) == [(1, "D", "d_model"), (1, "N", "n_heads"), (1, "K", "n_kv_heads"),
                             (2, "H", "resolved_head_dim")]
    assert not wrong_bindings(src)
    assert wrong_bindings("K = cfg.d_model\n") == [(1, "K", "d_model")]
    assert wrong_bindings("L = model.cfg.window\n") == [(1, "L", "window")]
    assert wrong_bindings("C = cfg.sparse_top_k\n") == [(1, "C", "sparse_top_k")]  # undeclared


SOURCES = sorted([*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.cc"), *PACKAGE.rglob("*.h")])


def _rel(p: Path) -> str:
    return str(p.relative_to(PACKAGE))


@pytest.mark.parametrize("path", SOURCES, ids=_rel)
def test_every_shape_letter_is_in_the_alphabet(path):
    unknown = sorted((line, letter, where) for line, letters, where in
                     shapes_of(path.name, path.read_text()) for letter in letters
                     if letter not in SHAPE_LETTERS)
    assert not unknown, "\n".join(f"{_rel(path)}:{line}: {letter!r} in {where!r} is not in "
                                  f"refmodel.shapes.SHAPE_LETTERS" for line, letter, where
                                  in unknown)


@pytest.mark.parametrize("path", SOURCES, ids=_rel)
def test_no_shape_holds_a_letter_beside_its_parts(path):
    clashes = sorted(parts_clashes(shapes_of(path.name, path.read_text())))
    assert not clashes, "\n".join(f"{_rel(path)}:{line}: {where!r} holds a letter of "
                                  f"refmodel.shapes.PARTS beside its parts" for line, _, where
                                  in clashes)


@pytest.mark.parametrize("path", [p for p in SOURCES if p.suffix == ".py"], ids=_rel)
def test_every_letter_bound_to_a_config_field_is_that_fields_letter(path):
    wrong = wrong_bindings(path.read_text())
    assert not wrong, "\n".join(
        f"{_rel(path)}:{line}: {letter} = cfg.{f}, but refmodel.shapes.FIELDS gives "
        f"{f} the letter {FIELD_LETTER.get(f, '(none: declare it)')}" for line, letter, f in wrong)


def test_scan_covers_the_variants_and_the_kernels():
    names = {p.name for p in SOURCES}
    assert names >= {"common.py", "mla.py", "linear.py", "linear_scan.py", "sparse.py",
                     "model.py", "moe.py", "rows.py", "rows.cc", "panels.h", "attend.cc"}
