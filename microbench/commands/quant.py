"""`quant`: quantized steps, products and quality: decode and prefill at every precision on the
native kernel and on XLA beside their counted bytes, the formulation table, and bits per byte
and KL divergence per weight, activation and KV format."""

from __future__ import annotations

import dataclasses
import time

from microbench.commands.study import DEFAULT_PEAKS, add_output, finish, progress_bar, saved_roofs


def add_args(p) -> None:
    p.add_argument("--quick", action="store_true",
                   help="`medium` cut to the fewest layers whose int8 weights are twice the "
                        "last-level cache, a 1024 x 1024 weight, the micro recipe: ~2 minutes")
    p.add_argument("--model", default=None, help="preset of the step timings (default medium)")
    p.add_argument("--layers", type=int, default=None,
                   help="time the preset's first LAYERS layers (0: all of them)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved timing rounds")
    p.add_argument("--peaks", default=None,
                   help="peaks.json whose DRAM read roof predicts each step (default: the first "
                        f"of {', '.join(DEFAULT_PEAKS)} that exists; none: no prediction)")
    add_output(p, "results/quant")


def run(args) -> int:
    from microbench import harness
    from microbench.files import check_writable_dir
    from microbench.studies.quant import Setup, measure, quick_setup

    t0 = time.perf_counter()
    setup = quick_setup() if args.quick else Setup()
    changes = {f: v for f, v in (("model", args.model), ("layers", args.layers),
                                 ("rounds", args.rounds)) if v is not None}
    setup = dataclasses.replace(setup, **changes)
    setup.check()
    roofs = saved_roofs(args.peaks)
    check_writable_dir(args.out)
    with progress_bar("quant") as progress:
        result = measure(setup, roofs["memory"] if roofs else None, progress)
    result["roofs"] = roofs
    result["environment"] = harness.environment()
    result["wall_s"] = time.perf_counter() - t0
    return finish("quant", result, args.out, t0, plot=not args.no_plot)
