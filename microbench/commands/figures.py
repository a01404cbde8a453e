"""`figures`: redraw every figure of figures/ from the results saved in figures/data."""

from __future__ import annotations

from pathlib import Path


def add_args(p) -> None:
    p.add_argument("--data", default="figures/data",
                   help="folder with peaks.json, phases.json (and serve.json, simulate.json "
                        "when present)")
    p.add_argument("--out", default="figures", help="output folder")


def run(args) -> int:
    from microbench import summary  # no JAX: figures/ redraws wherever matplotlib runs

    for f in summary.draw(args.out, args.data):
        print(f"wrote {f}")
    for f in simulate_figures(args.out, args.data):
        print(f"wrote {f}")
    return 0


def simulate_figures(out_dir, data_dir) -> list[Path]:
    """The simulate figures and simulate.md from data_dir/simulate.json, when it exists
    (`microbench simulate`), written into out_dir as one set."""
    src = Path(data_dir) / "simulate.json"
    if not src.exists():
        return []
    from microbench.files import output_set, read_json, write_text_atomic
    from microbench.plots.simulate import draw_simulate, simulate_summary

    result = read_json(src)
    with output_set(out_dir) as tmp:
        written = draw_simulate(result, tmp)
        written.append(write_text_atomic(tmp / "simulate.md", simulate_summary(result) + "\n"))
    return [Path(out_dir) / p.relative_to(tmp) for p in written]
