"""The attention registry: every variant class under its kind (`ModelConfig.attention`, or a
`layer_pattern` entry), and what depends on which kinds exist.

A leaf module: the variants (`refmodel/attention/*.py`) register into it and the config
validates through it, so neither imports the other. Everything that depends on which kinds
exist (config validation, legends, the option sets the golden test, the compiler cross-check
and the sweeps cover, the compiler's known differences) goes through the functions below, so
no code outside a variant's own file names its kind. `refmodel.attention` imports every
variant, which fills the table.
"""

from __future__ import annotations

_REGISTRY: dict[str, type] = {}


def register(*kinds: str):
    """Class decorator: make the variant available under each of `kinds`."""

    def wrap(cls):
        for kind in kinds:
            if kind in _REGISTRY:
                raise ValueError(f"attention kind {kind!r} is registered twice")
            _REGISTRY[kind] = cls
        return cls

    return wrap


def registered() -> tuple[str, ...]:
    """Names of every registered attention kind."""
    return tuple(_REGISTRY)


def get(kind: str) -> type:
    """The variant class registered under `kind`; an unknown kind lists the valid ones."""
    try:
        return _REGISTRY[kind]
    except KeyError:
        raise ValueError(
            f"attention={kind!r} is not a registered kind; choose one of {sorted(_REGISTRY)}"
        ) from None


def option_sets(kinds: tuple[str, ...] | None = None) -> dict[str, dict]:
    """{label: config changes} of every option set of `kinds` (default: every registered kind),
    e.g. {"gqa": {"attention": "gqa"}, ..., "mla absorbed": {"attention": "mla",
    "mla_absorb": True}}."""
    out = {}
    for kind in registered() if kinds is None else kinds:
        for label, changes in get(kind).option_sets(kind).items():
            out[label] = {"attention": kind, **changes}
    return out


def measured_in(sweep: str) -> tuple[str, ...]:
    """Labels of the option sets a variant lists for `sweep` in its `MEASURE`."""
    sets = option_sets()
    return tuple(label for label, changes in sets.items()
                 if sweep in get(changes["attention"]).MEASURE.get(label, ()))


def kinds_in(cfg) -> tuple[str, ...]:
    """The distinct mixer kinds a config runs, in layer order ("none" left out)."""
    return tuple(k for k in dict.fromkeys(cfg.layer_kinds) if k != "none")


def validate(cfg) -> None:
    """Each variant in use checks the config fields it reads."""
    for kind in kinds_in(cfg):
        get(kind).validate(cfg, kind)


def label(cfg) -> str:
    """Short legend name of a config's mixers: each kind's option-set label, "+"-joined."""
    return "+".join(get(k).label(cfg, k) if k != "none" else k
                    for k in dict.fromkeys(cfg.layer_kinds))


def implementation_only() -> tuple[str, ...]:
    """Ops some variant's implementation executes that an engine for it would not."""
    return tuple(dict.fromkeys(op for cls in _REGISTRY.values() for op in cls.IMPLEMENTATION_ONLY))


def compiler_differences(cfg, phase: str, batch: int, context: int,
                         native_solve: bool = False) -> dict[str, float]:
    """{reason: FLOPs} the compiler counts beyond the formulas, summed over the layers."""
    out: dict[str, float] = {}
    for kind in kinds_in(cfg):
        layers = cfg.layer_kinds.count(kind)
        for reason, flops in get(kind).compiler_differences(
                cfg, kind, phase, batch, context, native_solve).items():
            out[reason] = out.get(reason, 0.0) + layers * flops
    return out
