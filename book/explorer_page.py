"""The explorer page: what `book/build.py` stages for it (`files`): the page (explorer.md, a
raw HTML block with the controls and the chart), and, in _explorer/ (which _config.yml makes
the site's static folder, so they are served as _static/...), Plotly's JavaScript, the data
(explorer.py, explorer_chips.py) as a script and book/explorer.js, which reads the controls,
sums the counts and redraws the chart.

Plotly rather than Altair: its Python package carries its own plotly.min.js (one file served
from the site, nothing fetched from a CDN), it writes the figure here, and the page updates it
with one call (`Plotly.react`) whose hover labels are the measured points' tooltips. Altair
needs three scripts (Vega, Vega-Lite, vega-embed) that its Python package does not ship.
"""

from __future__ import annotations

import json
from pathlib import Path

import explorer  # noqa: E402  (beside this file)
import explorer_chips  # noqa: E402

BOOK = Path(__file__).resolve().parent
PHASE_LABELS = {"prefill": "prefill (the prompt: TTFT)", "decode_attention": "decode attention",
                "decode_ffn": "decode FFN", "decode": "decode step (TPOT)"}


def data(cache: Path) -> dict:
    """Everything the page reads: grids, formats, models (counts) and chips (roofs, points)."""
    counts = explorer.counts(cache)
    chips = explorer_chips.spec_chips() + explorer_chips.measured_chips(explorer.models())
    return {"dtypes": list(explorer.DTYPES), "batches": list(explorer.BATCHES),
            "batch_max": explorer.BATCH_MAX, "contexts": list(explorer.CONTEXTS),
            "tokens": list(explorer.TOKENS), "phases": PHASE_LABELS, "models": counts,
            "chips": chips}


def figure_html() -> str:
    """The chart's div and its first drawing, written by Plotly: log-log axes, empty traces
    that explorer.js fills (Plotly.react) as the controls move."""
    import plotly.graph_objects as go

    fig = go.Figure()
    fig.update_layout(
        template="plotly_white", height=520, margin=dict(l=70, r=20, t=30, b=60),
        xaxis=dict(type="log", title="arithmetic intensity (FLOP/byte)"),
        yaxis=dict(type="log", title="FLOP/s (attainable on the roofs; measured: timed)"),
        legend=dict(orientation="h", y=-0.18), hovermode="closest")
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id="explorer-chart",
                       config={"displaylogo": False, "responsive": True})


def _select(id_: str, label: str) -> str:
    return f'<label>{label}<br><select id="{id_}"></select></label>\n'


def _number(id_: str, label: str, lo: int, hi: int, value: int) -> str:
    return (f'<label>{label}<br><input id="{id_}" type="number" min="{lo}" max="{hi}" '
            f'step="1" value="{value}"></label>\n')


ROWS = (("x-at", "counted at"), ("x-flops", "FLOPs"), ("x-bytes", "bytes moved"),
        ("x-intensity", "intensity"), ("x-compute", "compute roof"),
        ("x-memory", "memory roof"), ("x-ridge", "ridge"), ("x-bound", "which roof binds"),
        ("x-ridge-batch", "compute-bound from batch"), ("x-kv-token", "KV cache per token"),
        ("x-fit", "batch that fits in memory"), ("x-ttft", "TTFT lower bound"),
        ("x-tpot", "TPOT lower bound"), ("x-model-source", "model"))


def page() -> str:
    controls = (_select("x-model", "model") + _select("x-chip", "chip")
                + _select("x-phase", "phase")
                + _number("x-batch", "batch", 1, explorer.BATCH_MAX, 1)
                + _number("x-context", "context", explorer.CONTEXTS[0], explorer.CONTEXTS[-1],
                          1024)
                + _select("x-weight", "weights") + _select("x-kv", "KV cache"))
    rows = "".join(f'<tr><th>{label}</th><td id="{id_}"></td></tr>\n' for id_, label in ROWS)
    html = ('<script src="_static/plotly.min.js"></script>\n'
            '<div id="explorer">\n<div class="explorer-controls" style="display:flex;'
            'flex-wrap:wrap;gap:0.8em;margin-bottom:0.8em">\n' + controls + "</div>\n"
            + figure_html() + '\n<table id="explorer-numbers" class="table">\n' + rows
            + "</table>\n</div>\n"
            '<script src="_static/explorer-data.js"></script>\n'
            '<script src="_static/explorer.js"></script>\n')
    return (BOOK / "explorer.md").read_text(encoding="utf-8").replace("<!-- explorer -->",
                                                                       html)


def files(cache: Path) -> dict[str, str | bytes]:
    """{path in the staged source: content} of the page and its scripts."""
    from plotly.offline import get_plotlyjs

    return {"explorer.md": page(),
            "_explorer/plotly.min.js": get_plotlyjs(),
            "_explorer/explorer-data.js": "window.EXPLORER_DATA = "
            + json.dumps(data(cache), separators=(",", ":")) + ";\n",
            "_explorer/explorer.js": (BOOK / "explorer.js").read_bytes()}
