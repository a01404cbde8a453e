"""`speculative`: speculative decoding on the trained byte-level pair: acceptance vs k,
measured vs predicted speedup, the verify step on the roofline, batch where it stops paying."""

from __future__ import annotations

import dataclasses
import time

from microbench.commands.study import (
    DEFAULT_PEAKS,
    add_output,
    finish,
    ints,
    progress_bar,
    saved_roofs,
)


def add_args(p) -> None:
    p.add_argument("--quick", action="store_true",
                   help="the micro pair (trained in seconds), few tokens: about a minute")
    p.add_argument("--ks", type=ints, default=None, help="comma list of k (proposals)")
    p.add_argument("--batches", type=ints, default=None,
                   help="comma list of batch sizes for the verify/decode cost ratio")
    p.add_argument("--prompts", type=int, default=None, help="prompts (validation files)")
    p.add_argument("--new-tokens", type=int, default=None, help="tokens generated per prompt")
    p.add_argument("--peaks", default=None,
                   help="peaks.json with this machine's roofs for the roofline panel (default: "
                        f"the first of {', '.join(DEFAULT_PEAKS)} that exists; none: no roofs)")
    add_output(p, "results/speculative")


def run(args) -> int:
    from microbench import harness
    from microbench.files import check_writable_dir
    from microbench.studies.speculative import QUICK, Setup, measure

    t0 = time.perf_counter()
    setup = QUICK if args.quick else Setup()
    changes = {f: getattr(args, f) for f in ("ks", "batches", "prompts", "new_tokens")
               if getattr(args, f) is not None}
    setup = dataclasses.replace(setup, **changes)
    setup.check()
    roofs = saved_roofs(args.peaks)
    check_writable_dir(args.out)
    with progress_bar("speculative") as progress:
        result = measure(setup, roofs, progress)
    result["environment"] = harness.environment()
    result["wall_s"] = time.perf_counter() - t0
    return finish("speculative", result, args.out, t0, plot=not args.no_plot, keep_copy=True)
