"""The seam between the model and its fast paths: named ops, one dispatcher, five backends.

The model files hold the reference computation, plain JAX a reader can follow. A step that a
faster implementation may replace is a method marked `@ops.op("name")`: its body is the
reference, and `ModelConfig.backend` picks who runs it. Backends register implementations
(`@ops.implements("name", "native")`) in `refmodel/backends/`; an argument of a backend's own
type (the serving engine's pages) brings its implementation whatever the backend
(`implements_type`). An implementation returns
`NotImplemented` for a case it does not cover (a bfloat16 cache, a soft-capped softmax), and
the call falls through to the next backend in the chain, then to the reference. This mirrors
`jax.nn.dot_product_attention(..., implementation=...)` and vLLM's attention backends: one call
in the model, the implementation chosen in one place, every implementation tested against the
reference (tests/test_backends.py).

    "reference"     the model files' own code, nothing else
    "xla"           the same ops laid out for XLA's CPU compiler (refmodel/backends/xla.py)
    "output-major"  "xla" with weight matrices stored [out, in], as ggml stores them
    "native"        the C++ kernels of refmodel/kernels where they apply, else "xla"
    "pallas"        the Pallas kernels of refmodel/pallas where they apply, else "xla"

What is an algorithm stays in the model and keeps its own count (MLA naive or absorbed, linear
attention chunked or recurrent, the sliding ring); what sits behind the seam is an
implementation of one algorithm. A backend that stores weights its own way converts them once,
when the model is built (`prepare`), into weight types that multiply as `x @ w` does.

This module imports no backend: `refmodel/__init__.py` imports `refmodel.backends`, which fills
the tables below. Without it the reference still runs, and asking for another backend is an
error that says so.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

BACKENDS = ("reference", "xla", "output-major", "native", "pallas")
# Who is asked, in order, before the reference runs.
CHAIN: dict[str, tuple[str, ...]] = {
    "reference": (),
    "xla": ("xla",),
    "output-major": ("xla",),
    "native": ("native", "xla"),
    "pallas": ("pallas", "xla"),
}

_IMPLS: dict[tuple[str, str], Callable] = {}  # (op, backend) -> implementation
_PREPARE: dict[str, Callable] = {}  # backend -> fn(model) storing its weights
_CONTRACT: dict[type, Callable] = {}  # weight type -> fn(x, w, axes)
_CONTRACT_EACH: dict[type, Callable] = {}  # weight type -> fn(x, ws, axes), several at once
_BY_TYPE: dict[tuple[str, type], Callable] = {}  # (op, argument type) -> implementation
_LOADED: set[str] = {"reference"}
_OPS: set[str] = set()


def provide(backend: str) -> None:
    """Mark `backend` as loaded (its module has registered its implementations)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: choose one of {BACKENDS}")
    _LOADED.add(backend)


def loaded() -> tuple[str, ...]:
    """The backends whose implementations are registered in this process."""
    return tuple(b for b in BACKENDS if b in _LOADED)


def check(backend: str) -> None:
    """Raise unless every backend in `backend`'s chain is loaded."""
    if backend not in CHAIN:
        raise ValueError(f"backend={backend!r}: choose one of {BACKENDS}")
    missing = [b for b in CHAIN[backend] if b not in _LOADED]
    if missing:
        raise RuntimeError(f"backend={backend!r} needs {missing}, which did not load here "
                           "(refmodel.backends was not imported); use backend='reference'")


def op(name: str):
    """Decorator for a layer method whose body is the reference of op `name`: a call runs the
    first implementation of `layer.cfg.backend`'s chain that takes the case, else the body."""

    def wrap(reference: Callable) -> Callable:
        _OPS.add(name)

        @functools.wraps(reference)
        def call(layer, *args, **kwargs):
            for a in args:  # an argument of a backend's own type brings its implementation
                if (name, type(a)) in _BY_TYPE:
                    return _BY_TYPE[(name, type(a))](layer, *args, **kwargs)
            for fn in implementations(name, layer.cfg.backend):
                out = fn(layer, *args, **kwargs)
                if out is not NotImplemented:
                    return out
            return reference(layer, *args, **kwargs)

        call.reference = reference
        call.op = name
        return call

    return wrap


def implementations(name: str, backend: str) -> list[Callable]:
    """The implementations of op `name` that `backend` tries, in order."""
    check(backend)
    return [_IMPLS[(name, b)] for b in CHAIN[backend] if (name, b) in _IMPLS]


def implements(name: str, backend: str):
    """Decorator: register `fn(layer, *args)` as `backend`'s implementation of op `name`."""

    def wrap(fn: Callable) -> Callable:
        if backend not in BACKENDS or backend == "reference":
            raise ValueError(f"backend={backend!r}: choose one of {BACKENDS[1:]}")
        if (name, backend) in _IMPLS:
            raise ValueError(f"op {name!r} has two {backend!r} implementations")
        _IMPLS[(name, backend)] = fn
        return fn

    return wrap


def implements_type(name: str, cls: type):
    """Decorator: register `fn(layer, *args)` as op `name`'s implementation whenever one of its
    arguments is a `cls` (the serving engine's pages, whatever the model's backend)."""

    def wrap(fn: Callable) -> Callable:
        _BY_TYPE[(name, cls)] = fn
        return fn

    return wrap


def registered() -> dict[str, tuple[str, ...]]:
    """{op: backends implementing it} of every op the model names (tests list them)."""
    return {name: tuple(b for b in BACKENDS if (name, b) in _IMPLS) for name in sorted(_OPS)}


def prepares(backend: str):
    """Decorator: register `fn(model)`, which stores `backend`'s weights its own way."""

    def wrap(fn: Callable) -> Callable:
        _PREPARE[backend] = fn
        return fn

    return wrap


def prepare(model) -> None:
    """Store the freshly built model's weights as its backend wants them (in place)."""
    check(model.cfg.backend)
    fn = _PREPARE.get(model.cfg.backend)
    if fn is not None:
        fn(model)


def weight_type(cls: type, contract: Callable, each: Callable | None = None) -> None:
    """Register a stored-weight type: `contract(x, w, axes)` is its `jnp.tensordot(x, w,
    axes)` (the type also defines `x @ w`, and `w.dequantize()`, its float array);
    `each(x, ws, axes)`, if given, is `contract_each` for several weights of the type in one
    call (or NotImplemented for a case it does not take)."""
    _CONTRACT[cls] = contract
    if each is not None:
        _CONTRACT_EACH[cls] = each


def matrix_contract(x, w, axes: int):
    """`contract` for a type stored as one matrix [prod(inputs), prod(outputs)] whose `x @ w`
    takes x [..., prod(inputs)]: its declared shape (`w.declared`, else `w.shape`) gives the
    output axes back."""
    lead = x.shape[:x.ndim - axes]
    shape = getattr(w, "declared", None) or w.shape
    return (x.reshape(*lead, -1) @ w).reshape(*lead, *shape[axes:])


def contract_each(x, ws, axes: int = 1) -> tuple:
    """(contract(x, w, axes) for w in ws): the products a layer takes of one input (q, k and
    v; gate and up). Weights of a type that multiplies several at once (`weight_type`'s
    `each`) run as one call, which reads x once and shares one parallel region: vLLM's
    fused QKV and gate-up projections, here without concatenating the weights."""
    each = _CONTRACT_EACH.get(type(ws[0]))
    if each is not None and all(type(w) is type(ws[0]) for w in ws):
        out = each(x, ws, axes)
        if out is not NotImplemented:
            return tuple(out)
    return tuple(contract(x, w, axes) for w in ws)


def contract(x, w, axes: int = 1):
    """x [..., *in] times w [*in, *out] over the `axes` input axes -> [..., *out], whatever
    type stores w (a float array, a quantized or a backend's stored weight)."""
    fn = _CONTRACT.get(type(w))
    if fn is not None:
        return fn(x, w, axes)
    w = w.dequantize() if hasattr(w, "dequantize") else w
    # as one matrix product, [..., prod(in)] @ [prod(in), prod(out)]: the per-head axes are
    # a view of the same bytes, and XLA:CPU keeps a 2-D weight's product on its GEMV path
    lead = x.shape[:x.ndim - axes]
    y = x.reshape(*lead, -1) @ w.reshape(-1, math.prod(w.shape[axes:]))
    return y.reshape(*lead, *w.shape[axes:])
