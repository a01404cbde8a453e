"""Drawing saved results: which module draws each study's result, the figures and NAME.md of
one study (`draw_study`, what a study command ends in and what `figures` redraws), and every
file of figures/ from figures/data (`redraw_all`, `python -m microbench figures`).

Saved results live per machine (`figures/data/<machine>/`, machines.slug) and each folder's
figures go to `figures/<machine>/`: a figure reads one folder, and a folder whose files come
from two machines is refused before anything is drawn (machines.check_one_machine).

A study's plots module is imported by name when it is drawn, and its draw and summary
functions are looked up then, so a study that is never drawn is never imported.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

from microbench import machines, plots
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
    data_dir (default out_dir), written into out_dir as one set; nothing without peaks.json."""
    if not (Path(data_dir or out_dir) / "peaks.json").exists():
        return []
    peaks, phases = plots.load_saved(data_dir or out_dir)
    with output_set(out_dir) as tmp:
        written = plots.draw_all(tmp, peaks, phases)
        if phases is not None:
            written.append(write_text_atomic(tmp / "summary.md", summary_markdown(peaks, phases)))
    return [Path(out_dir) / p.relative_to(tmp) for p in written]


def check_folder(data_dir) -> str | None:
    """The one machine of a folder's saved results (machines.check_one_machine over every
    result file `figures` draws from it); ValueError before anything is drawn if it mixes."""
    names = ["peaks", "phases", *STUDIES]
    results = {f"{n}.json": read_json(Path(data_dir) / f"{n}.json") for n in names
               if (Path(data_dir) / f"{n}.json").exists()}
    return machines.check_one_machine(results, str(data_dir))


def redraw_folder(out_dir, data_dir) -> list[Path]:
    """One machine's folder: the roofline's figures and summary, then each study saved there."""
    check_folder(data_dir)
    written = draw_roofline(out_dir, data_dir)
    for name in STUDIES:
        written += redraw(name, out_dir, data_dir)
    return written


def redraw_all(out_dir, data_dir) -> list[Path]:
    """What `python -m microbench figures` writes: data_dir's figures into out_dir when it is
    one machine's folder (it holds result files), else each machine folder's under it into
    out_dir/<machine>. Every folder is checked before any is drawn."""
    folders = machines.machine_folders(data_dir)
    if not folders:
        raise ValueError(f"--data {data_dir}: no saved results (NAME.json) in it or in a "
                         "folder under it")
    for folder in folders:
        check_folder(folder)
    if folders == [Path(data_dir)]:
        return redraw_folder(out_dir, data_dir)
    return [p for f in folders for p in redraw_folder(Path(out_dir) / f.name, f)]
