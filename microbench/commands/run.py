"""`run`: the main job — measure this machine's roofs and the model's phases, draw every figure."""

from __future__ import annotations

import time


def add_args(p) -> None:
    p.add_argument("--quick", action="store_true",
                   help="fewer, smaller points: peaks --quick, then phases --quick")
    p.add_argument("--out", default="results/microbench", help="output folder")
    p.add_argument("--no-peer", action="store_true", help="skip the PyTorch peer")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--platform", default="auto",
                   help="which path: auto (default: JAX's default backend), cpu (the CPU's "
                        "roofs and peers), gpu or tpu (an accelerator's: device memory, GEMM "
                        "per dtype, bfloat16 phases; on a CPU backend that path is forced at "
                        "tiny sizes and labelled so)")
    add_backend(p)


def add_backend(p) -> None:
    p.add_argument("--backend", default="auto",
                   help="who runs every timed phase's ops: auto (default: the native CPU "
                        "kernels where they build, else xla), reference, xla, output-major or "
                        "native (refmodel.backends.choose)")


def check_backend(backend: str) -> str:
    """--backend as a ValueError naming the option (one line on the command line), before
    anything is measured; returns what "auto" resolves to here."""
    from refmodel import backends

    try:
        return backends.choose(backend)
    except (ValueError, RuntimeError) as e:
        raise ValueError(f"--backend {backend!r}: {e}") from None


def run(args) -> int:
    from microbench.phases import suite
    from microbench.plots import summary
    from microbench.roofs import platform

    t0 = time.perf_counter()
    chosen = platform.current(args.platform)  # a bad --platform fails before measuring
    if not chosen.accelerator:
        check_backend(args.backend)
    out = suite.run(args.quick, args.out, peer=not args.no_peer,
                    progress=not args.no_progress, backend=args.backend,
                    platform=args.platform)
    print(summary.summary_markdown(out["peaks"], out["phases"]))
    for f in out["files"]:
        print(f"wrote {f}")
    print(f"done in {time.perf_counter() - t0:.0f} s")
    return 0
