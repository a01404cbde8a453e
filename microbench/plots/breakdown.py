"""The per-op breakdown figure, drawn only from a saved breakdown result (breakdown.json).

Horizontal bars of measured time per op (the named scopes of `refmodel`, as
`microbench.phases.breakdown` attributes XLA:CPU's thunk events to them), longest first, each
annotated with the rate it achieved on its counted cost: GFLOP/s alone for an op of counted
intensity >= FLOP_BOUND_INTENSITY, else GB/s (and GFLOP/s when it counts FLOPs too); an op
counted in FLOPs only (RoPE, softmax: elementwise on activations the cost model moves no bytes
for) shows GFLOP/s. The unattributed remainder (whole phase minus the sum of ops) is its own
grey bar, so the bars add up to the whole phase. Imports matplotlib only (no JAX): `python -m
microbench.plots.breakdown breakdown.json [out.png]` redraws a saved result.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402

from microbench.files import read_json  # noqa: E402
from microbench.schema import KIND_BREAKDOWN  # noqa: E402

FLOP_BOUND_INTENSITY = 8.0  # FLOP/byte above which an op is labelled by GFLOP/s, not GB/s


def _label(row: dict) -> str:
    text = _rate(row)
    if row.get("holds"):
        text += f"  [kernels also hold {', '.join(row['holds'])}]"
    return text


def _rate(row: dict) -> str:
    if row["time_s"] <= 0:
        held = ", ".join(row.get("held_by") or []) or "another op"
        return f"no kernel of its own: fused into {held}" if row.get("fused") else ""
    gflops, gbytes = row.get("gflops_per_s"), row.get("gbytes_per_s")
    intensity = row.get("intensity")
    if intensity is not None and intensity >= FLOP_BOUND_INTENSITY and gflops:
        return f"{gflops:.3g} GFLOP/s ({intensity:.3g} FLOP/B)"
    if row.get("bytes"):
        flop = f", {gflops:.3g} GFLOP/s" if row.get("flops") else ""
        return f"{gbytes:.3g} GB/s{flop}"
    if row.get("flops"):
        return f"{gflops:.3g} GFLOP/s (no counted bytes)"
    return "no counted cost"


def _remainder_label(result: dict) -> str:
    share = result["unattributed_share"]
    if share >= 0:
        return f"{share:.1%} of the phase: dispatch, gaps between kernels"
    return (f"{-share:.1%} below zero: the traced ops summed to more than the untraced "
            "whole (noise, or kernels overlapping)")


def machine_name(env: dict) -> str:
    cpu = env.get("cpu_model") or env.get("device_kind") or "unknown device"
    n = env.get("cpu_count")
    return f"{cpu} ({n} CPUs)" if n and env.get("backend") == "cpu" else cpu


def breakdown_figure(result: dict) -> Figure:
    """Time per op (ms) as horizontal bars, each labelled with its achieved rate."""
    if result.get("kind") != KIND_BREAKDOWN:
        raise ValueError(f"not a breakdown result: kind {result.get('kind')!r}, expected "
                         f"{KIND_BREAKDOWN!r}")
    rows = [r for r in result["rows"] if r["time_s"] > 0 or r.get("fused")]
    names = [r["op"] for r in rows] + ["unattributed"]
    times = [r["time_s"] * 1e3 for r in rows] + [result["unattributed_s"] * 1e3]
    labels = [_label(r) for r in rows] + [_remainder_label(result)]
    fig = Figure(figsize=(11, 0.42 * len(names) + 2.4), layout="constrained")
    ax = fig.add_subplot()
    y = list(range(len(names)))[::-1]
    colors = ["#1f77b4" if r["counted"] else "#ff7f0e" for r in rows] + ["0.6"]
    ax.barh(y, times, color=colors)
    ax.set_yticks(y, names)
    right = max(max(times), 1e-9)
    for yi, t, text in zip(y, times, labels, strict=True):
        ax.text(max(t, 0) + right * 0.01, yi, text, va="center", fontsize=9)
    ax.set_xlim(min(0, min(times)) * 1.1, right * 1.55)
    ax.axvline(0, color="0.3", lw=0.8)
    whole = result["whole"]
    ax.set_xlabel(f"measured time per call (ms); the bars sum to the whole phase, "
                  f"{whole['time_s'] * 1e3:.3g} ms ({whole['gbytes_per_s']:.3g} GB/s, "
                  f"{whole['gflops_per_s']:.3g} GFLOP/s on its counted cost)")
    ax.set_title(f"{result['model']} ({result['label']}, {result['dtype']}) {result['phase']}, "
                 f"batch {result['batch']}, context {result['context']}\n"
                 f"on {machine_name(result.get('environment', {}))}; blue: counted ops, "
                 "orange: no counted cost, grey: unattributed", fontsize=11)
    ax.grid(axis="y", visible=False)
    return fig


def save_breakdown_figure(result: dict, path: str | Path) -> Path:
    """Draw and write the figure atomically (a temporary file, then os.replace)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = breakdown_figure(result)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    try:
        fig.savefig(tmp, dpi=130)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not 1 <= len(argv) <= 2:
        print("usage: python -m microbench.plots.breakdown breakdown.json [out.png]")
        return 2
    src = Path(argv[0])
    out = Path(argv[1]) if len(argv) == 2 else src.with_suffix(".png")
    print(save_breakdown_figure(read_json(src), out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
