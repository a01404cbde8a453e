"""The README's results table: one row per study and machine, read from its saved result in
`figures/data/<machine>/`.

Each row names the machine, date and backend that made it, from the result file's own
environment block, so the table can hold results from more than one machine without mixing
them. `python -m
microbench.plots.results [DATA_DIR]` prints it; tests/test_readme.py checks the README holds
exactly this text between its `results:start` and `results:end` markers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from microbench import machines
from microbench.roofline import BAND

HEADER = ("| study | what this machine showed | machine | date | backend |\n"
          "|---|---|---|---|---|")


def machine(env: dict) -> str:
    """'AMD EPYC, family 25 model 17 (Zen 4 (Genoa)), 2 cores' from an environment block."""
    return machines.describe(env)


def _env_cells(env: dict, backend: str | None = None) -> str:
    jax_backend = env.get("backend", "?")
    which = f"{jax_backend}, {backend}" if backend else jax_backend
    return f"{machine(env)} | {env.get('date_utc', '?')[:10]} | {which}"


def _peaks(d: dict) -> str:
    roofs = d["main_roofs"]
    gemm, read = roofs["gemm_float32"]["value"], roofs["main_read"]["value"]
    return (f"float32 GEMM {gemm / 1e9:.0f} GFLOP/s, main-memory read {read / 1e9:.1f} GB/s: "
            f"ridge point {gemm / read:.1f} FLOP/byte")


def _phases(d: dict) -> str:
    points, rep = d["points"], d["report"]
    held = sum(BAND[0] <= p["measured_over_predicted"] <= BAND[1] for p in points)
    prefill = min(rep["prefill_over_gemm"]) if isinstance(rep["prefill_over_gemm"], list) \
        else rep["prefill_over_gemm"]
    return (f"{held} of {len(points)} phase points within [{BAND[0]}, {BAND[1]}] of their "
            f"predicted time; batch-1 decode at {rep['decode_over_dram']:.2f} of the memory "
            f"roof, prefill at {prefill:.2f} or more of the GEMM roof")


def _decode(d: dict) -> str:
    if d.get("pairs"):
        return _decode_formats(d)
    one = {r["program"]: r for r in d["table"] if r["batch"] == 1}
    best = max(one.values(), key=lambda r: r.get("over_llama.cpp") or 0)
    return (f"batch-1 decode of llama-309m: {best['program']} at "
            f"{best['over_llama.cpp']:.2f}x llama.cpp's speed and {best['over_read']:.2f} of "
            f"the C read; xla at {one['xla']['over_llama.cpp']:.2f}x")


def _decode_formats(d: dict) -> str:
    """Each like-for-like pair's batch-1 ratio with both sides' bits per weight, our weights'
    share of the C read, and the KL from float32 on held-out text where it was measured."""
    pairs = [r for r in d["pairs"] if r["target"]]
    bpw = {name: f["matrix_bpw"] for name, f in d["formats"].items()}
    ratios = ", ".join(
        f"{r['pair'].split(' vs ')[0]} {r['speed']:.2f}x {r['pair'].split(' vs ')[1]} "
        f"({bpw[r['ours']]:.2f} vs {bpw[r['theirs']]:.2f} bits/weight)" for r in pairs)
    reads = ", ".join(f"{r['ours_of_read']:.2f}" for r in pairs)
    text = (f"batch-1 decode of {d['model']} against llama.cpp's same format: {ratios}; our "
            f"weights streamed at {reads} of the C read")
    q = d.get("quality") or {}
    kl = {r["program"]: r["kl_mean"] for r in q.get("rows", [])}
    held = [f"{r['pair'].split(' vs ')[0]} {kl[r['ours']]:.1e} vs {kl[r['theirs']]:.1e}"
            for r in pairs if r["ours"] in kl and r["theirs"] in kl and bpw[r["ours"]] < 32]
    if held:
        text += f"; KL from float32 on held-out text ({q['recipe']}): {', '.join(held)}"
    return text


def _serve(d: dict) -> str:
    c = d["claims"]
    held = ", ".join(f"{p} {r:.0f}" for p, r in sorted(
        (c.get("max_rate_at_target") or {}).items(), key=lambda kv: -(kv[1] or 0)) if r)
    text = (f"requests/s each policy serves with {c['attainment_target']:.0%} of requests "
            f"within the SLOs: {held or 'none'} (measured saturation "
            f"{c['saturation_requests_per_s']:.0f})")
    pc = c.get("prefix_cache") or {}
    if pc.get("prefill_tokens_off"):
        text += (f"; prefix cache at the same unsaturated load: "
                 f"{pc['prefill_tokens_saved'] / pc['prefill_tokens_off']:.0%} of prefill tokens "
                 f"saved, mean TTFT {pc['mean_ttft_off_s'] * 1e3:.1f} -> "
                 f"{pc['mean_ttft_on_s'] * 1e3:.1f} ms")
    return text


def _simulate(d: dict) -> str:
    err = d["check"]["errors"]
    spread, table = err["spread"], err["table"]
    return (f"table simulator's MAPE vs the engine's own run-to-run spread: TTFT "
            f"{table['ttft_s']:.0%} vs {spread['ttft_s']:.0%}, TPOT {table['tpot_s']:.0%} vs "
            f"{spread['tpot_s']:.0%}, E2E {table['e2e_s']:.0%} vs {spread['e2e_s']:.0%}; "
            f"per step {table['step_error']:.0%} (roofline predictor "
            f"{err['roofline']['step_error']:.0%})")


def _speculative(d: dict) -> str:
    best = max(d["runs"], key=lambda r: r["speedup"])
    drafter = "prompt lookup" if best["drafter"] == "lookup" else f"a {best['drafter']} draft"
    return f"best measured speedup {best['speedup']:.2f}x ({drafter}, k = {best['k']})"


def _quant(d: dict) -> str:
    from microbench.plots.quant import readme_claim

    return readme_claim(d)


def _collectives(d: dict) -> str:
    best = max((r for r in d["results"] if r["collective"] == "all_reduce"),
               key=lambda r: r["busbw"]["median"])
    return (f"all_reduce on {d['devices']['count']} emulated devices (threads of one process) "
            f"peaks at "
            f"{best['busbw']['median'] / 1e9:.2f} GB/s bus bandwidth: a memory copy, not a link")


STUDIES = (  # (result file, row name, headline)
    ("peaks", "roofs (`microbench peaks`)", _peaks),
    ("phases", "phases (`microbench phases`)", _phases),
    ("decode", "decode race (`microbench decode`)", _decode),
    ("serve", "serving (`microbench serve`)", _serve),
    ("simulate", "simulator (`microbench simulate`)", _simulate),
    ("speculative", "speculative (`microbench speculative`)", _speculative),
    ("quant", "quantization (`microbench quant`)", _quant),
    ("collectives", "collectives (`microbench collectives`)", _collectives),
)


def table(data: Path) -> str:
    """The markdown table of every study saved under `data`, one machine folder after another
    (the README links the summaries above it: the book includes the table, where repository
    paths would not resolve)."""
    lines = [HEADER]
    for folder in machines.machine_folders(data):
        for name, label, headline in STUDIES:
            path = Path(folder) / f"{name}.json"
            if not path.exists():
                continue
            d = json.loads(path.read_text())
            backends = sorted({p.get("backend", "xla") for p in d.get("points", [])})
            backend = d.get("report", {}).get("backend") or ", ".join(backends) or None
            env = _env_cells(d.get("environment") or {}, backend)
            lines.append(f"| {label} | {headline(d)} | {env} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(table(Path(sys.argv[1] if len(sys.argv) > 1 else "figures/data")), end="")
