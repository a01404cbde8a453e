"""The speed report: is our decode bandwidth-bound and our prefill compute-bound, for real?

Regime: the `medium` preset (~317M parameters, 1.27 GB of float32 weights, ~40x this
machine's last-level cache). A batch-1 decode step must stream every weight from DRAM, so its
achieved bytes/s over the DRAM roof measured on the same machine says how close the decode
loop gets to the hardware; a long prefill is a chain of large GEMMs, so its achieved FLOP/s
over the measured float32 GEMM roof says the same for compute. A peer program runs the same
shape in the same run: Hugging Face transformers' LlamaForCausalLM in PyTorch (float32,
batch 1, KV cache), when torch and transformers are installed (`pip install -e ".[peers]"`).

Targets (issues 6 and 10): decode >= 0.70 of main memory's read roof, prefill (512 and 1024
tokens) >= 0.80 of the f32 GEMM roof, and decode >= 1.5x the PyTorch peer's speed. Each ratio is
taken against the roof of its own moment (the roof x the drift probes' factor around the
point, microbench.probe) and, beside it, against the roof as measured in the rounds. Only
reported, never asserted in tests.
"""

from __future__ import annotations

import json
import subprocess
import sys

import refmodel
from microbench.phases import Budget, compute_roof, measure_point
from refmodel import costs

MODEL = "medium"
DECODE_CONTEXT = 128
PREFILL_LENS = (512, 1024)
TARGETS = {"decode_over_dram": 0.70, "prefill_over_gemm": 0.80, "speedup_over_peer": 1.5}


def main_memory_roofs(peaks: dict) -> tuple[dict, dict]:
    """(read-only, best) roofs of main memory (DRAM or HBM) from a peaks result."""
    memory = [r for r in peaks["roofs"]["memory"] if not r.get("suspect")]
    main = [r for r in memory if r["level"].split()[0] in ("DRAM", "HBM")]
    if not main:
        raise ValueError("peaks.roofs.memory: no DRAM/HBM roof to compare the decode against")
    read = next((r for r in main if r["level"].endswith(" read")), None)
    best = max(main, key=lambda r: r["value"])
    return read or best, best


REPORT_TIMING = Budget(budget_s=3.0)


def _factor(point: dict, key: str, roof_value: float) -> float:
    """The roof of the point's moment (its prediction's, drift-scaled and capped at the best
    round, phases._drift_cap) over the roof as measured in the rounds."""
    pred = point.get("predicted") or {}
    now = pred.get("memory_bytes_per_s" if key == "memory" else "compute_flops_per_s")
    return now / roof_value if now else 1.0


def measure_report(peaks: dict, timing: Budget = REPORT_TIMING, peer: bool = True,
                   probe=None) -> dict:
    """Decode and prefill of the medium model against this machine's roofs (and a peer)."""
    cfg = refmodel.presets.get(MODEL)
    phases = refmodel.Phases(refmodel.init(cfg, seed=0))
    decode = measure_point(phases, "decode", 1, DECODE_CONTEXT, peaks, timing, label=MODEL,
                           probe=probe)
    prefills = [measure_point(phases, "prefill", 1, n, peaks, timing, label=MODEL, probe=probe)
                for n in PREFILL_LENS]
    del phases
    (dram, best), gemm = main_memory_roofs(peaks), compute_roof(peaks["roofs"], cfg.dtype)
    m, decode_bw = _factor(decode, "memory", dram["value"]), decode["bytes_per_s"]["median"]
    out = {
        "model": MODEL, "params": costs.param_counts(cfg)["total"],
        "decode": decode, "prefill": prefills[0], "prefills": prefills,
        "dram_roof_bytes_per_s": dram["value"], "dram_roof": dram["name"],
        "dram_roof_program": dram.get("program", dram["source"]),
        "dram_best_bytes_per_s": best["value"], "dram_best": best["name"],
        "gemm_roof_flops_per_s": gemm["value"],
        "gemm_roof_program": gemm.get("program", gemm["source"]),
        "decode_drift": m,
        "decode_over_dram": decode_bw / (dram["value"] * m),
        "decode_over_dram_unscaled": decode_bw / dram["value"],
        "decode_over_best_dram": decode_bw / best["value"],
        "prefill_over_gemm": [p["flops_per_s"]["median"] / (gemm["value"] *
                                                             _factor(p, "compute",
                                                                     gemm["value"]))
                              for p in prefills],
        "prefill_over_gemm_unscaled": [p["flops_per_s"]["median"] / gemm["value"]
                                       for p in prefills],
        "targets": TARGETS, "peer": None, "speedup_over_peer": None,
    }
    if peer:
        out["peer"] = hf_peer(cfg, DECODE_CONTEXT)
        if out["peer"].get("step_s"):
            out["speedup_over_peer"] = out["peer"]["step_s"] / decode["timing"]["median"]
            out["peer"]["bytes_per_s"] = decode["bytes"] / out["peer"]["step_s"]
    return out


PEER_SCRIPT = r"""
import json, sys, time
import torch
from transformers import LlamaConfig, LlamaForCausalLM
spec = json.loads(sys.argv[1])
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=spec["V"], hidden_size=spec["D"], intermediate_size=spec["F"],
                  num_hidden_layers=spec["L"], num_attention_heads=spec["N"],
                  num_key_value_heads=spec["K"], head_dim=spec["H"], tie_word_embeddings=False,
                  max_position_embeddings=4096, torch_dtype=torch.float32)
model = LlamaForCausalLM(cfg).eval()
with torch.inference_mode():
    ids = torch.randint(0, spec["V"], (1, spec["S"]))
    out = model(ids, use_cache=True)
    past, tok = out.past_key_values, ids[:, -1:]
    times = []
    for i in range(spec["steps"]):
        t = time.perf_counter()
        out = model(tok, past_key_values=past, use_cache=True)
        past = out.past_key_values
        times.append(time.perf_counter() - t)
times = sorted(times[3:])
print(json.dumps({"step_s": times[len(times) // 2], "samples": times,
                  "torch": torch.__version__, "threads": torch.get_num_threads(),
                  "params": sum(p.numel() for p in model.parameters())}))
"""


def hf_peer(cfg: refmodel.ModelConfig, context: int, steps: int = 23) -> dict:
    """Median decode-step time of transformers' Llama of the same shape, or why it is absent."""
    spec = {"V": cfg.vocab_size, "D": cfg.d_model, "F": cfg.d_ff, "L": cfg.n_layers,
            "N": cfg.n_heads, "K": cfg.n_kv_heads, "H": cfg.head_size, "S": context,
            "steps": steps}
    try:
        proc = subprocess.run([sys.executable, "-c", PEER_SCRIPT, json.dumps(spec)],
                              capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        return {"name": "transformers LlamaForCausalLM (PyTorch, f32)", "error": "timed out"}
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"name": "transformers LlamaForCausalLM (PyTorch, f32)",
                "error": f"not run: {last}"}
    return {"name": "transformers LlamaForCausalLM (PyTorch, f32)",
            **json.loads(proc.stdout.strip().splitlines()[-1])}


def format_report(rep: dict) -> str:
    """The lines the `phases --report` command prints."""
    d = rep["decode"]
    lines = [
        f"model '{rep['model']}' ({rep['params'] / 1e6:.0f}M params, float32)",
        f"decode  batch 1 @ context {d['context']}: {d['timing']['median'] * 1e3:.1f} ms/step, "
        f"{d['bytes_per_s']['median'] / 1e9:.1f} GB/s = {rep['decode_over_dram']:.2f} of the "
        f"'{rep['dram_roof']}' roof at its moment ({rep['dram_roof_bytes_per_s'] / 1e9:.1f} GB/s "
        f"x drift {rep['decode_drift']:.2f}; roof: {rep['dram_roof_program']}; target >= "
        f"{TARGETS['decode_over_dram']}); {rep['decode_over_dram_unscaled']:.2f} of the roof "
        f"as measured in the rounds; {rep['decode_over_best_dram']:.2f} of the best main-memory "
        f"roof ('{rep['dram_best']}', {rep['dram_best_bytes_per_s'] / 1e9:.1f} GB/s, reads + "
        "writes)",
    ]
    for p, r, r0 in zip(rep["prefills"], rep["prefill_over_gemm"],
                        rep["prefill_over_gemm_unscaled"], strict=True):
        lines.append(
            f"prefill batch 1 x {p['context']} tokens: {p['timing']['median'] * 1e3:.0f} ms, "
            f"{p['flops_per_s']['median'] / 1e9:.0f} GFLOP/s = {r:.2f} of the f32 GEMM roof at "
            f"its moment ({rep['gemm_roof_flops_per_s'] / 1e9:.0f} GFLOP/s x drift "
            f"{_factor(p, 'compute', rep['gemm_roof_flops_per_s']):.2f}; roof: "
            f"{rep['gemm_roof_program']}; target >= "
            f"{TARGETS['prefill_over_gemm']}); {r0:.2f} of the roof as measured in the rounds")
    peer = rep.get("peer")
    if peer and peer.get("step_s"):
        lines.append(f"peer {peer['name']} (torch {peer['torch']}): "
                     f"{peer['step_s'] * 1e3:.1f} ms/step, {peer['bytes_per_s'] / 1e9:.1f} GB/s; "
                     f"ours is {rep['speedup_over_peer']:.2f}x faster "
                     f"(target >= {TARGETS['speedup_over_peer']})")
    elif peer:
        lines.append(f"peer {peer['name']}: {peer.get('error')}")
    return "\n".join(lines)
