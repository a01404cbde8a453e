"""`figures`: redraw every figure of figures/ from the results saved in figures/data: each
machine's folder figures/data/<machine>/ into figures/<machine>/, one machine per figure."""

from __future__ import annotations

from pathlib import Path


def add_args(p) -> None:
    p.add_argument("--data", default="figures/data",
                   help="one machine's folder of results (peaks.json, phases.json, serve.json, "
                        "simulate.json, speculative.json, quant.json, collectives.json, "
                        "parallel.json, decode.json: those present), or a folder of such "
                        "folders, one per machine (figures/data/<machine>/)")
    p.add_argument("--out", default="figures",
                   help="output folder (a folder of folders of results: OUT/<machine>/)")


def run(args) -> int:
    from microbench.plots import saved  # no JAX: figures/ redraws wherever matplotlib runs

    for f in saved.redraw_all(args.out, args.data):
        print(f"wrote {f}")
    return 0


def saved_figures(name: str, out_dir, data_dir) -> list[Path]:
    """The figures and NAME.md from data_dir/NAME.json, when it exists (plots.saved.redraw)."""
    from microbench.plots import saved

    return saved.redraw(name, out_dir, data_dir)


def simulate_figures(out_dir, data_dir) -> list[Path]:
    return saved_figures("simulate", out_dir, data_dir)


def speculative_figures(out_dir, data_dir) -> list[Path]:
    return saved_figures("speculative", out_dir, data_dir)
