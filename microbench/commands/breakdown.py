"""`breakdown`: where one phase's time goes, per op, beside its counted FLOPs and bytes."""

from __future__ import annotations

import os
import time
from pathlib import Path

PHASE_CHOICES = ("prefill", "decode_attention", "decode_ffn", "decode")


def add_args(p) -> None:
    p.add_argument("--model", default="medium", help="preset to run (default: medium)")
    p.add_argument("--phase", default="decode", help=f"one of {', '.join(PHASE_CHOICES)}")
    p.add_argument("--batch", type=int, default=1, help="sequences (default 1)")
    p.add_argument("--context", type=int, default=128,
                   help="cached tokens (decode) or prompt length (prefill); default 128")
    p.add_argument("--attention", help="override the preset's attention kind (any registered "
                   "kind: refmodel.attention.registered())")
    p.add_argument("--mla-absorb", action="store_true", help="MLA with weight absorption")
    p.add_argument("--backend", help="who runs the model's ops: xla (default), reference, "
                   "output-major or native (refmodel.backends; ModelConfig.backend)")
    p.add_argument("--calls", type=int, default=5, help="traced calls (default 5)")
    p.add_argument("--warm", action="store_true",
                   help="time a decode phase with its data left in the caches between calls "
                        "(default: evicted before every call, as the phase points time it)")
    p.add_argument("--budget", type=float, default=1.0,
                   help="seconds to time the whole phase (default 1)")
    p.add_argument("--out", default="results/microbench/breakdown", help="output folder")
    p.add_argument("--no-plot", action="store_true", help="write the JSON only")


def check_args(args) -> None:
    """Raise ValueError naming the option, the value and what is allowed."""
    import refmodel

    names = sorted(refmodel.presets.PRESETS)
    if args.model not in names:
        raise ValueError(f"--model {args.model!r}: choose one of {names}")
    if args.phase not in PHASE_CHOICES:
        raise ValueError(f"--phase {args.phase!r}: choose one of {list(PHASE_CHOICES)}")
    for option, value, low in (("--batch", args.batch, 1), ("--calls", args.calls, 1),
                               ("--context", args.context, 1)):
        if value < low:
            raise ValueError(f"{option} {value}: must be an integer >= {low}")
    if not args.budget > 0:
        raise ValueError(f"--budget {args.budget}: must be a positive number of seconds")
    kinds = refmodel.attention.registered()
    if args.attention is not None and args.attention not in kinds:
        raise ValueError(f"--attention {args.attention!r}: choose one of {list(kinds)}")
    if args.backend is not None and args.backend not in refmodel.ops.BACKENDS:
        raise ValueError(f"--backend {args.backend!r}: choose one of "
                         f"{list(refmodel.ops.BACKENDS)}")
    if args.backend == "native":
        from refmodel import kernels

        if not kernels.available():
            raise ValueError(f"--backend native: the native kernels are not available here "
                             f"({kernels.why_not()}); use --backend output-major or xla")
    cfg = config(args)
    need = refmodel.costs.param_counts(cfg)["total"] * (2 if "16" in cfg.dtype else 4)
    have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need > have / 2:
        raise ValueError(f"--model {args.model!r}: {need / 1e9:.0f} GB of weights does not "
                         f"fit half of this machine's {have / 1e9:.0f} GB; real presets are "
                         "counted, not run: `python -m refmodel costs --preset NAME`")
    from microbench.commands.phases import available_memory, fmt_bytes
    from microbench.phases.points import memory_bytes

    need, have = memory_bytes(cfg, args.phase, args.batch, args.context), available_memory()
    if need > have:
        raise ValueError(f"--batch {args.batch} --context {args.context}: {args.phase} needs "
                         f"about {fmt_bytes(need)} of memory (weights, cache and activations), "
                         f"more than the {fmt_bytes(have)} this machine has available")


def config(args):
    import dataclasses

    import refmodel

    cfg = refmodel.presets.get(args.model)
    changes = {}
    if args.attention:
        changes["attention"] = args.attention
    if args.mla_absorb:
        changes["mla_absorb"] = True
    if args.backend:
        changes["backend"] = args.backend
    return dataclasses.replace(cfg, **changes) if changes else cfg


def run(args) -> int:
    from microbench.files import output_set
    from microbench.phases.breakdown import format_table, measure_breakdown
    from microbench.phases.points import Budget

    t0 = time.perf_counter()
    check_args(args)
    with output_set(args.out) as out:  # breakdown.json and .png: one set
        result = measure_breakdown(config(args), args.phase, args.batch, args.context,
                                   calls=args.calls, timing=Budget(budget_s=args.budget),
                                   out=out, cold=False if args.warm else None)
        wrote = [Path(args.out) / "breakdown.json"]
        if not args.no_plot:
            from microbench.plots.breakdown import save_breakdown_figure

            save_breakdown_figure(result, out / "breakdown.png")
            wrote.append(Path(args.out) / "breakdown.png")
    print(format_table(result))
    print(f"wrote {', '.join(map(str, wrote))} in {time.perf_counter() - t0:.0f} s")
    return 0
