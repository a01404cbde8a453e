"""Every figure, drawn from saved JSON results only: matplotlib and the JAX-free parts of
microbench (schema, files, roofline), never JAX or Flax, so `figures/` can be redrawn anywhere.

Modules, each importing only those before it (no cycle):
    common.py       rc settings, number formatting, atomic save, loading, the two roof lines
    roofline.py     roofline.png: the machine's roofs, ridges, what XLA reaches (peaks.json)
    hierarchy.py    hierarchy.png: bandwidth per level at a fixed thread count, drift by round
    claims.py       what a phase figure's titles and notes say, computed from its data (pure)
    points.py       phases_roofline.png (prefill vs decode of one model on the roofs),
                    variants_roofline.png (every attention variant, phase by phase) and
                    gap.png (measured against predicted), plus what every phase figure
                    shares (Notes, ridge_of)
    sweeps.py       batch.png, throughput.png, crossover.png, kv_cache.png (phases.json)
    breakdown.py    the per-op breakdown figure (breakdown.json; `python -m
                    microbench.plots.breakdown breakdown.json [out.png]`)
    serving.py      the serve_*.png figures and serve.md (serve.json)
    simulate.py     the simulate_*.png figures and simulate.md (simulate.json): the
                    simulator against the engine, then the on-paper studies from scale.py
    scale.py        simulate_scale/pd/afd/sram.png and their summary: serving at scale on
                    paper, against published SLOs and colocated baselines
    speculative.py  speculative.png and speculative.md (speculative.json)
    quant.py        quant.png and quant.md (quant.json)
    collectives.py  collectives.png and collectives.md (collectives.json)
    parallel.py     parallel_tp.png, parallel_ep.png and parallel.md (parallel.json)
    decode.py       decode.png and decode.md (decode.json: the decode race)
    summary.py      summary.md and the speed report's lines (peaks.json, phases.json)
    results.py      the README's results table, one row per study and machine
    saved.py        which module draws each study's result; `redraw_all` is what `python -m
                    microbench figures` draws, `draw_study` what a study command ends in

The serving, simulate, speculative, quant, collectives and parallel modules also redraw one
saved result: `python -m microbench.plots.<module> result.json [out_dir]`. Add a roofline
figure by writing `<name>_figure(results, title=None) -> Figure` in the module of its data and
listing it in FIGURES; a study's figures by adding the study to saved.STUDIES.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from microbench.plots.common import PALETTE, fmt_si, load_results, save
from microbench.plots.hierarchy import has_series, hierarchy_figure
from microbench.plots.points import gap_figure, phases_roofline_figure, variants_roofline_figure
from microbench.plots.roofline import roofline_figure
from microbench.plots.sweeps import batch_figure, crossover_figure, kv_figure, throughput_figure
from microbench.schema import read_result

FIGURES = {"roofline": roofline_figure, "hierarchy": hierarchy_figure,
           "phases_roofline": phases_roofline_figure,
           "variants_roofline": variants_roofline_figure,
           "batch": batch_figure, "throughput": throughput_figure,
           "crossover": crossover_figure, "kv_cache": kv_figure, "gap": gap_figure}
PEAKS_FIGURES = ("roofline", "hierarchy")  # drawn from peaks.json
PHASE_FIGURES = ("phases_roofline", "variants_roofline", "batch", "throughput", "crossover",
                 "kv_cache", "gap")

__all__ = ["FIGURES", "PALETTE", "PEAKS_FIGURES", "PHASE_FIGURES", "batch_figure",
           "crossover_figure", "draw_all", "fmt_si", "gap_figure", "hierarchy_figure",
           "kv_figure", "load_results", "load_saved", "phases_roofline_figure", "plot_files",
           "roofline_figure", "save", "throughput_figure", "variants_roofline_figure"]


def plot_files(paths: Sequence[str | Path], out_dir: str | Path,
               name: str = "roofline") -> Path:
    """Redraw figure `name` from saved result files into out_dir/<name>.png."""
    fig = FIGURES[name](load_results(paths))
    return save(fig, Path(out_dir) / f"{name}.png")


def load_saved(data_dir: str | Path) -> tuple[dict, dict | None]:
    """(peaks, phases or None) from data_dir/peaks.json and data_dir/phases.json, validated."""
    data = Path(data_dir)
    peaks = read_result(data / "peaks.json")
    phases_file = data / "phases.json"
    phases = read_result(phases_file) if phases_file.exists() else None
    return peaks, phases


def draw_all(out_dir: str | Path, peaks: dict, phases: dict | None = None) -> list[Path]:
    """Every figure of a peaks result and, when given, of a phases result, into out_dir (a
    phase figure is given both: the headline draws the peaks' spec ceilings)."""
    out = Path(out_dir)
    # the device path measures no cache levels: no hierarchy figure without its series
    names = [n for n in PEAKS_FIGURES if n != "hierarchy" or has_series(peaks)]
    written = [save(FIGURES[name]([peaks]), out / f"{name}.png") for name in names]
    if phases is not None:
        written += [save(FIGURES[name]([phases, peaks]), out / f"{name}.png")
                    for name in PHASE_FIGURES]
    return written
