"""`plot`: redraw a figure from saved result files (one or several machines)."""

from __future__ import annotations


def add_args(p) -> None:
    p.add_argument("results", nargs="+", help="peaks.json files")
    p.add_argument("--out", default="figures", help="output folder")
    p.add_argument("--figure", default="roofline", help="figure name (plot.FIGURES)")


def run(args) -> int:
    from microbench import plot

    print(f"wrote {plot.plot_files(args.results, args.out, args.figure)}")
    return 0
