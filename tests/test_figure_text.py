"""Every figure of figures/ is readable at slide size and says what made it. Each is drawn from
figures/data by the functions `python -m microbench figures` uses (plots.saved), and checked
just before it is written (common.checking, the seam in `save`): no two drawn texts overlap
(titles, axis and tick labels, roof and point labels, legend entries, footnotes), every text
lies inside the canvas, no label on the data covers a marker, no legend covers a marker or a
label on the data or a quarter of the canvas, no axes title runs past two lines; and its text
names the machine and backend of its result file (common.made_by), or says it is on paper.

Extents are matplotlib's own: `Text.get_window_extent` with the Agg renderer at the dpi the file
is saved at (the text alone: an annotation's leader line may end at its point). A text counts
when matplotlib draws it (visible, non-empty, a tick label only for a tick in view), found by
recording `Text.draw` during one draw. Touching is allowed (SLACK); tick labels are checked
against each other too.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from unittest import mock

import matplotlib.pyplot as plt
import pytest
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PathCollection
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from microbench import machines, plots
from microbench.plots import common, saved
from microbench.plots.claims import backends
from microbench.plots.common import made_by


def _data(study: str) -> Path:
    """The committed machine folder a study's figures are drawn from."""
    return machines.data_folder("peaks" if study in ("headline", "roofline") else study)


SLACK = 0.5  # pixels two extents may share: touching is allowed, rounding is not a collision
LEGEND_SHARE = 0.25  # the most of the canvas one legend may cover
TITLE_LINES = 2  # the most lines an axes title may run to


def _drawn_texts(fig, renderer) -> list[Text]:
    """The Text artists one draw of `fig` actually paints, in drawing order."""
    drawn, draw = [], Text.draw

    def record(text, rend):
        if text.get_visible() and text.get_text().strip():
            drawn.append(text)
        return draw(text, rend)

    with mock.patch.object(Text, "draw", record):
        fig.draw(renderer)
    return list(dict.fromkeys(drawn))


def _overlap(a, b) -> bool:
    return (min(a.x1, b.x1) - max(a.x0, b.x0) > SLACK
            and min(a.y1, b.y1) - max(a.y0, b.y0) > SLACK)


def _name(text: Text) -> str:
    return repr(text.get_text()[:60])


def _on_the_data(text: Text) -> bool:
    """A label placed on an axes' data (ax.text / ax.annotate), not a title or tick label."""
    ax = text.axes
    return ax is not None and text in ax.texts


def _markers(fig, dpi: float) -> list:
    """(axes, box) of every data marker drawn: a line's markers, a scatter's points (error-bar
    caps are left out: a label may sit on a bar's end)."""
    out = []
    for ax in fig.findobj(Axes):
        for line in ax.get_lines():
            marker = line.get_marker()
            if not line.get_visible() or marker in (None, "", " ", "None", "none", "_", "|"):
                continue
            r = line.get_markersize() * dpi / 72 / 2 * 0.7
            for x, y in line.get_transform().transform(line.get_xydata()):
                out.append((ax, Bbox([[x - r, y - r], [x + r, y + r]])))
        for coll in ax.collections:
            if not isinstance(coll, PathCollection) or not coll.get_visible():
                continue
            sizes = coll.get_sizes()
            for i, (x, y) in enumerate(coll.get_offset_transform().transform(coll.get_offsets())):
                r = (sizes[i % len(sizes)] ** 0.5 if len(sizes) else 6) * dpi / 72 / 2 * 0.7
                out.append((ax, Bbox([[x - r, y - r], [x + r, y + r]])))
    return [(ax, b) for ax, b in out if all(map(math.isfinite, (b.x0, b.y0)))]


def problems(fig) -> tuple[list[str], str]:
    """(what makes `fig` unreadable, one line each (empty: readable); all its drawn text)."""
    if not hasattr(fig.canvas, "get_renderer"):
        FigureCanvasAgg(fig)
    saved_dpi = fig.dpi
    fig.set_dpi(plt.rcParams["savefig.dpi"])
    try:
        renderer = fig.canvas.get_renderer()
        texts = _drawn_texts(fig, renderer)
        boxes = {t: Text.get_window_extent(t, renderer) for t in texts}  # text only
        canvas = fig.bbox.frozen()
        legends = [a for a in fig.findobj(Legend) if a.get_visible()]
        legend_boxes = [(lg, lg.get_window_extent(renderer)) for lg in legends]
        markers = _markers(fig, fig.dpi)
    finally:
        fig.set_dpi(saved_dpi)
    out = []
    for t, box in boxes.items():
        if (box.x0 < canvas.x0 - SLACK or box.y0 < canvas.y0 - SLACK
                or box.x1 > canvas.x1 + SLACK or box.y1 > canvas.y1 + SLACK):
            out.append(f"outside the canvas: {_name(t)}")
    for a, b in itertools.combinations(boxes, 2):
        if _overlap(boxes[a], boxes[b]):
            out.append(f"overlap: {_name(a)} / {_name(b)}")
    for lg, box in legend_boxes:
        if box.width * box.height > LEGEND_SHARE * canvas.width * canvas.height:
            share = box.width * box.height / canvas.width / canvas.height
            out.append(f"a legend covers {share:.0%} of the canvas")
        for t in boxes:
            if _on_the_data(t) and _overlap(box, boxes[t]):
                out.append(f"legend over a label on the data: {_name(t)}")
        covered = sum(_overlap(box, m) for ax, m in markers if lg.axes is None or ax is lg.axes)
        if covered:
            out.append(f"legend ({_name(lg.texts[0]) if lg.texts else ''}...) over {covered} "
                       "data marker(s)")
    for t, box in boxes.items():
        hit = sum(_overlap(box, m) for ax, m in markers if ax is t.axes)
        if _on_the_data(t) and hit:
            out.append(f"label over {hit} data marker(s): {_name(t)}")
    for ax in fig.findobj(Axes):
        for title in (ax.title, ax._left_title, ax._right_title):
            if title.get_visible() and title.get_text().count("\n") >= TITLE_LINES:
                out.append(f"axes title of {title.get_text().count(chr(10)) + 1} lines: "
                           f"{_name(title)}")
    return out, " ".join(" ".join(t.get_text().split()) for t in texts)


def _draw(study: str, folder: Path) -> dict[str, tuple[list[str], str]]:
    """{figure file name: (its problems, its text)} for every figure `figures` draws for
    `study` ("roofline": peaks.json and phases.json; "headline": phases_roofline.png alone,
    as plots.draw_all draws it). The PNGs themselves are not rendered: the check is the test."""
    found = {}
    check = lambda fig, path: found.setdefault(Path(path).name, problems(fig))  # noqa: E731
    with common.checking(check), mock.patch.object(Figure, "savefig", lambda *a, **k: None):
        if study == "headline":
            peaks, phases = plots.load_saved(_data(study))
            common.save(plots.FIGURES["phases_roofline"]([phases, peaks]),
                        folder / "phases_roofline.png")
        elif study == "roofline":
            saved.draw_roofline(folder, _data(study))
        else:
            saved.redraw(study, folder, _data(study))
    return found


# Figures computed on paper (roofline arithmetic, counted bytes): no machine ran them, and
# they say so; every other figure names the machine and the backend its result file records.
ON_PAPER = {"kv_cache.png", "parallel_tp.png", "parallel_ep.png", "simulate_scale.png",
            "simulate_pd.png", "simulate_afd.png", "simulate_sram.png"}


def _made_by(study: str, name: str) -> str:
    """What a figure drawn from `study`'s result must say about the machine that made it."""
    if name in ON_PAPER:
        return "on paper"
    if study != "roofline":
        return made_by(json.loads((_data(study) / f"{study}.json").read_text()).get("environment"))
    if name.removesuffix(".png") in plots.PEAKS_FIGURES:
        return made_by(json.loads((_data(study) / "peaks.json").read_text())["environment"])
    phases = json.loads((_data(study) / "phases.json").read_text())
    return made_by(phases["environment"], backends(phases["points"]))


def test_the_headline_figure_is_readable(tmp_path):
    (problems_, text), = _draw("headline", tmp_path).values()
    assert problems_ == []
    assert _made_by("roofline", "phases_roofline.png") in text


@pytest.mark.parametrize("study", ["roofline", *saved.STUDIES])
def test_every_figure_is_readable_and_names_its_machine(study, tmp_path):
    found = _draw(study, tmp_path)
    assert found, f"no figure drawn for {study}"
    assert {name: p for name, (p, _) in found.items() if p} == {}
    missing = {name: _made_by(study, name) for name, (_, text) in found.items()
               if _made_by(study, name).lower() not in text.lower()}
    assert missing == {}
