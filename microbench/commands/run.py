"""`run`: the main job — measure this machine's roofs and the model's phases, draw every figure."""

from __future__ import annotations

import time


def add_args(p) -> None:
    p.add_argument("--quick", action="store_true", help="about a minute on a 2-core laptop")
    p.add_argument("--out", default="results/microbench", help="output folder")
    p.add_argument("--no-peer", action="store_true", help="skip the PyTorch peer")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_matmul(p)


def add_matmul(p) -> None:
    p.add_argument("--matmul", default="auto",
                   help="the weight products of every timed phase: auto (default: the native "
                        "CPU kernels where they build, else XLA's), xla, output-major or native "
                        "(refmodel.kernels.choose)")


def check_matmul(matmul: str) -> str:
    """--matmul as a ValueError naming the option (one line on the command line), before
    anything is measured; returns what "auto" resolves to here."""
    from refmodel import kernels

    try:
        return kernels.choose(matmul)
    except (ValueError, RuntimeError) as e:
        raise ValueError(f"--matmul {matmul!r}: {e}") from None


def run(args) -> int:
    from microbench import suite, summary

    t0 = time.perf_counter()
    check_matmul(args.matmul)
    out = suite.run(args.quick, args.out, peer=not args.no_peer,
                    progress=not args.no_progress, matmul=args.matmul)
    print(summary.summary_markdown(out["peaks"], out["phases"]))
    for f in out["files"]:
        print(f"wrote {f}")
    print(f"done in {time.perf_counter() - t0:.0f} s")
    return 0
