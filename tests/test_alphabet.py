"""One shape letter, one meaning: the alphabet in `refmodel.shapes` is the one the package's
docstring shows and the only one its shape comments and einsum strings use."""

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

import refmodel
from refmodel.shapes import GLOBAL, SHAPE_LETTERS, VARIANT

PACKAGE = Path(refmodel.__file__).parent
# A bracket of shape text: letters, digits, spaces, commas, + - * / ( ), and `...`, `_` (so
# `[max_position, D]` and `[B, T, ...]` count; `x[t, s]` counts too but has no capital).
BRACKET = re.compile(r"\[([A-Za-z0-9_ ,+\-*/().]*)\]")
LETTER = re.compile(r"(?<![A-Za-z0-9_])[A-Z](?![A-Za-z0-9_])")  # a capital standing alone


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


def shape_letters(source: str) -> set[tuple[int, str, str]]:
    """(line, letter, where) for every lone capital in a bracket of a comment and every
    capital in the subscripts of an einsum call (jnp.einsum, np.einsum, ...)."""
    found = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            for m in BRACKET.finditer(tok.string):
                for letter in LETTER.findall(m.group(1)):
                    found.add((tok.start[0], letter, m.group(0)))
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "einsum" and node.args
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            spec = node.args[0].value
            for letter in re.findall(r"[A-Z]", spec):
                found.add((node.lineno, letter, spec))
    return found


def test_tables_are_disjoint_and_single_letters():
    assert not set(GLOBAL) & set(VARIANT)
    assert all(len(k) == 1 and k.isupper() for k in SHAPE_LETTERS)
    assert SHAPE_LETTERS == {**GLOBAL, **VARIANT}


def test_docstring_mirrors_shape_letters():
    assert docstring_tables() == SHAPE_LETTERS


def test_scanner_sees_comments_and_einsums():
    """The check below can fail: an unknown letter in either place is found."""
    src = ('import jax.numpy as jnp\n'
           'y = x  # [B, O, max_position]: not a letter of ours\n'
           'z = jnp.einsum("BOH,BH->BO", a, b)  # x[t, s] has no capital\n'
           's = "[B, O] in a string is not a comment"\n')
    letters = {(line, letter) for line, letter, _ in shape_letters(src)}
    assert letters == {(2, "B"), (2, "O"), (3, "B"), (3, "O"), (3, "H")}


SOURCES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_every_shape_letter_is_in_the_alphabet(path):
    unknown = sorted((line, letter, where) for line, letter, where in
                     shape_letters(path.read_text()) if letter not in SHAPE_LETTERS)
    assert not unknown, "\n".join(f"{path.name}:{line}: {letter!r} in {where!r} is not in "
                                  f"refmodel.shapes.SHAPE_LETTERS" for line, letter, where
                                  in unknown)


def test_scan_covers_the_variants():
    assert {p.name for p in SOURCES} >= {"common.py", "mla.py", "linear.py", "linear_scan.py",
                                         "sparse.py", "model.py", "moe.py"}
