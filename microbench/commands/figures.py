"""`figures`: redraw every figure of figures/ from the results saved in figures/data."""

from __future__ import annotations


def add_args(p) -> None:
    p.add_argument("--data", default="figures/data", help="folder with peaks.json, phases.json")
    p.add_argument("--out", default="figures", help="output folder")


def run(args) -> int:
    from microbench import summary  # no JAX: figures/ redraws wherever matplotlib runs

    for f in summary.draw(args.out, args.data):
        print(f"wrote {f}")
    return 0
