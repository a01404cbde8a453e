"""What a compiled GEMM really runs, read from its optimised HLO text (`compiled.as_text()`).

A float8 product asked of XLA is not proof of float8 arithmetic: where the chip or the
compiler lacks it, XLA converts the operands to bfloat16 or float32 and multiplies those
(XLA:CPU does). So the fp8 GEMM roof is kept only when a matrix product of the compiled
program takes float8 operands (`runs_fp8`). The matrix products are `dot` and `convolution`
instructions and the vendor-library custom calls (cuBLAS, cuBLASLt, hipBLASLt: targets that
name a gemm or matmul), found in every computation, fused ones included. Operand types are
read inline where the text prints them, else from the instruction that defines the operand.
The custom call's target also names the library behind XLA's matmul, the GEMM peer on a GPU.
"""

from __future__ import annotations

import re

_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<type>\([^)]*\)|[\w]+\[[^\]]*\]\S*|\w+\[\])"
    r"\s+(?P<op>[\w\-]+)\((?P<args>[^)]*)\)(?P<rest>.*)$")
_PARAMETER = re.compile(r"(?P<name>[\w.\-]+):\s*(?P<type>[a-z]\w*)\[")
_TARGET = re.compile(r'custom_call_target="(?P<target>[^"]+)"')
_LIBRARY = re.compile(r"gemm|matmul|cublas|hipblas", re.IGNORECASE)
MATMUL_OPS = ("dot", "convolution")


def _dtype(type_text: str) -> str:
    """'f8e4m3fn[64,64]{1,0}' -> 'f8e4m3fn'; a tuple's first element's."""
    return re.match(r"\(?\s*([a-z]\w*)", type_text).group(1)


_OPERAND = re.compile(r"(?:(?P<type>[a-z]\w*)\[[^\]]*\](?:\{[^}]*\})?\s+)?%(?P<name>[\w.\-]+)")


def _operand_types(args: str, types: dict[str, str]) -> list[str]:
    """Each operand's dtype: printed inline ('f8e4m3fn[64,64]{1,0} %a', older text) or
    looked up by its name ('%a')."""
    return [m["type"] or types.get(m["name"], "?") for m in _OPERAND.finditer(args)]


def matmuls(hlo_text: str) -> list[dict]:
    """Every matrix product of the HLO: {name, op, target (a custom call's), operands: [dtype]}."""
    types: dict[str, str] = {}
    found = []
    for line in hlo_text.splitlines():
        if "{" in line and "->" in line and "=" not in line.split("(")[0]:  # a computation
            types.update({m["name"]: m["type"] for m in _PARAMETER.finditer(line)})
        m = _INSTRUCTION.match(line)
        if not m:
            continue
        types[m["name"]] = _dtype(m["type"])
        target = _TARGET.search(m["rest"])
        if m["op"] in MATMUL_OPS or (m["op"] == "custom-call" and target
                                     and _LIBRARY.search(target["target"])):
            found.append({"name": m["name"], "op": m["op"],
                          "target": target["target"] if target else None,
                          "operands": _operand_types(m["args"], types)[:2]})
    return found


def is_fp8(dtype: str) -> bool:
    return dtype.startswith("f8")


def runs_fp8(hlo_text: str) -> tuple[bool, str]:
    """(True when some matrix product takes two float8 operands, the evidence in words)."""
    products = matmuls(hlo_text)
    if not products:
        return False, "no matrix product (dot, convolution or gemm call) in the compiled HLO"
    fp8 = [p for p in products if len(p["operands"]) == 2 and all(map(is_fp8, p["operands"]))]
    shown = fp8 or products
    words = "; ".join(f"{p['target'] or p['op']} on {' x '.join(p['operands'])}" for p in shown)
    return bool(fp8), words


def library(hlo_text: str) -> str | None:
    """The vendor library call behind the program's matrix product (a custom call's target),
    or None where the compiler emitted the product itself."""
    return next((p["target"] for p in matmuls(hlo_text) if p["target"]), None)
