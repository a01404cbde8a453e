"""`plot`: redraw a figure from saved result files (one or several machines)."""

from __future__ import annotations


def add_args(p) -> None:
    p.add_argument("results", nargs="+",
                   help="peaks.json and/or phases.json files (several machines at once)")
    p.add_argument("--out", default="figures", help="output folder")
    from microbench.plots import FIGURES

    p.add_argument("--figure", default="roofline", choices=sorted(FIGURES),
                   help="which figure (roofline, hierarchy: peaks files; the others: phases files)")


def run(args) -> int:
    from microbench import plots
    from microbench.files import check_writable_dir

    check_writable_dir(args.out)  # before reading and drawing: a bad --out fails first
    print(f"wrote {plots.plot_files(args.results, args.out, args.figure)}")
    return 0
