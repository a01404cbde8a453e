"""`figures`: redraw every figure of figures/ from the results saved in figures/data."""

from __future__ import annotations

from pathlib import Path


def add_args(p) -> None:
    p.add_argument("--data", default="figures/data",
                   help="folder with peaks.json, phases.json (and serve.json, simulate.json, "
                        "speculative.json, quant.json, collectives.json, parallel.json, "
                        "decode.json when present)")
    p.add_argument("--out", default="figures", help="output folder")


def run(args) -> int:
    from microbench import summary  # no JAX: figures/ redraws wherever matplotlib runs

    for f in summary.draw(args.out, args.data):
        print(f"wrote {f}")
    for name in SAVED:
        for f in saved_figures(name, args.out, args.data):
            print(f"wrote {f}")
    return 0


# saved result -> (module drawing it, its draw function, its summary function); each is
# redrawn when data_dir holds its JSON (the command that measured it writes both)
SAVED = {"simulate": ("microbench.plots.simulate", "draw_simulate", "simulate_summary"),
         "speculative": ("microbench.plots.speculative", "draw_speculative",
                         "speculative_summary"),
         "quant": ("microbench.plots.quant", "draw_quant", "quant_summary"),
         "collectives": ("microbench.plots.collectives", "draw_collectives",
                         "collectives_summary"),
         "parallel": ("microbench.plots.parallel", "draw_parallel", "parallel_summary"),
         "decode": ("microbench.plots.decode", "draw_decode", "decode_summary")}


def saved_figures(name: str, out_dir, data_dir) -> list[Path]:
    """The figures and NAME.md from data_dir/NAME.json, when it exists (`microbench NAME`),
    written into out_dir as one set."""
    import importlib

    src = Path(data_dir) / f"{name}.json"
    if not src.exists():
        return []
    from microbench.files import output_set, read_json, write_text_atomic

    module, draw, summary = SAVED[name]
    plots = importlib.import_module(module)
    result = read_json(src)
    with output_set(out_dir) as tmp:
        written = getattr(plots, draw)(result, tmp)
        written.append(write_text_atomic(tmp / f"{name}.md",
                                         getattr(plots, summary)(result) + "\n"))
    return [Path(out_dir) / p.relative_to(tmp) for p in written]


def simulate_figures(out_dir, data_dir) -> list[Path]:
    return saved_figures("simulate", out_dir, data_dir)


def speculative_figures(out_dir, data_dir) -> list[Path]:
    return saved_figures("speculative", out_dir, data_dir)
