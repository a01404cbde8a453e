"""Drawing saved results: which module draws each study's result, the figures and NAME.md of
one study (`draw_study`, what a study command ends in and what `figures` redraws), and every
file of figures/ from figures/data (`redraw_all`, `python -m microbench figures`).

A study's plots module is imported by name when it is drawn, and its draw and summary
functions are looked up then, so a study that is never drawn is never imported.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

from microbench import plots
from microbench.files import output_set, read_json, write_text_atomic
from microbench.plots.summary import summary_markdown


@dataclass(frozen=True)
class Drawn:
    """How one study's result NAME.json is drawn: module.draw(result, folder) -> [paths] and
    module.summary(result) -> the markdown of NAME.md."""

    module: str
    draw: str
    summary: str


STUDIES = {
    "serve": Drawn("microbench.plots.serving", "draw_serving", "serving_summary"),
    "simulate": Drawn("microbench.plots.simulate", "draw_simulate", "simulate_summary"),
    "speculative": Drawn("microbench.plots.speculative", "draw_speculative",
                         "speculative_summary"),
    "quant": Drawn("microbench.plots.quant", "draw_quant", "quant_summary"),
    "collectives": Drawn("microbench.plots.collectives", "draw_collectives",
                         "collectives_summary"),
    "parallel": Drawn("microbench.plots.parallel", "draw_parallel", "parallel_summary"),
    "decode": Drawn("microbench.plots.decode", "draw_decode", "decode_summary"),
}


def draw_study(name: str, result: dict, folder: Path, plot: bool = True) -> tuple[str, list]:
    """NAME.md and (with `plot`) the figures of one study's result, written into folder:
    (the summary's text, [NAME.md, figure paths...])."""
    drawn = STUDIES[name]
    module = importlib.import_module(drawn.module)
    summary = getattr(module, drawn.summary)(result)
    written = [write_text_atomic(Path(folder) / f"{name}.md", summary + "\n")]
    if plot:
        written += getattr(module, drawn.draw)(result, Path(folder))
    return summary, written


def redraw(name: str, out_dir, data_dir) -> list[Path]:
    """The figures and NAME.md from data_dir/NAME.json, when it exists, written into out_dir
    as one set (files.output_set); nothing when it does not."""
    src = Path(data_dir) / f"{name}.json"
    if not src.exists():
        return []
    result = read_json(src)
    with output_set(out_dir) as tmp:
        _, written = draw_study(name, result, tmp)
    return [Path(out_dir) / p.relative_to(tmp) for p in [*written[1:], written[0]]]


def draw_roofline(out_dir, data_dir=None) -> list[Path]:
    """Every figure of peaks.json and phases.json (plots.draw_all) and summary.md, from
    data_dir (default out_dir), written into out_dir as one set."""
    peaks, phases = plots.load_saved(data_dir or out_dir)
    with output_set(out_dir) as tmp:
        written = plots.draw_all(tmp, peaks, phases)
        if phases is not None:
            written.append(write_text_atomic(tmp / "summary.md", summary_markdown(peaks, phases)))
    return [Path(out_dir) / p.relative_to(tmp) for p in written]


def redraw_all(out_dir, data_dir) -> list[Path]:
    """What `python -m microbench figures` writes: the roofline's figures and summary, then
    each study saved in data_dir."""
    written = draw_roofline(out_dir, data_dir)
    for name in STUDIES:
        written += redraw(name, out_dir, data_dir)
    return written
