"""The speed report: is our decode bandwidth-bound and our prefill compute-bound, for real?

Regime: the `medium` preset (~317M parameters, 1.27 GB of float32 weights, ~40x this
machine's last-level cache). A batch-1 decode step must stream every weight from DRAM, so its
achieved bytes/s over the DRAM roof measured on the same machine says how close the decode
loop gets to the hardware; a long prefill is a chain of large GEMMs, so its achieved FLOP/s
over the measured float32 GEMM roof says the same for compute. A peer program runs the same
shape in the same run: Hugging Face transformers' LlamaForCausalLM in PyTorch (float32,
batch 1, KV cache), when torch and transformers are installed (`pip install -e ".[peers]"`).

Targets (plots.summary.TARGETS): decode >= 0.70 of main memory's read roof, prefill (512 and
1024 tokens) >= 0.80 of the f32 GEMM roof, and decode >= 1.5x the PyTorch peer's speed. Each
ratio is taken against the roof of its own moment (the roof x the drift probes' factor around
the point, microbench.roofs.probe) and, beside it, against the roof as measured in the rounds.
Only reported, never asserted in tests.
"""

from __future__ import annotations

import json
import subprocess
import sys

import refmodel
from microbench import roofline
from microbench.phases.points import Budget, measure_point
from microbench.plots.summary import TARGETS, moment_factor
from refmodel import backends, costs

MODEL = "medium"
DECODE_CONTEXT = 128
PREFILL_LENS = (512, 1024)


def main_memory_roofs(peaks: dict) -> tuple[dict, dict]:
    """(read-only, best) unflagged roofs of main memory (DRAM or HBM) from a peaks result."""
    main = roofline.main_roofs(peaks["roofs"]["memory"])
    if not main:
        raise ValueError("peaks.roofs.memory: no DRAM/HBM roof to compare the decode against")
    read = roofline.main_roof(main, roofline.READ)
    best = max(main, key=lambda r: r["value"])
    return read or best, best


REPORT_TIMING = Budget(budget_s=3.0)


def measure_report(peaks: dict, timing: Budget = REPORT_TIMING, peer: bool = True,
                   probe=None, backend: str = "auto") -> dict:
    """Decode and prefill of the medium model against this machine's roofs (and a peer), its
    backend `backend` (refmodel.backends.choose: "auto" is the native kernels on a CPU
    where they build)."""
    cfg = refmodel.presets.get(MODEL)
    cfg = cfg.replace(backend=backends.choose(backend, cfg.dtype, cfg.weight_format))
    phases = refmodel.Phases(refmodel.init(cfg, seed=0))
    decode = measure_point(phases, "decode", 1, DECODE_CONTEXT, peaks, timing, label=MODEL,
                           probe=probe)
    prefills = [measure_point(phases, "prefill", 1, n, peaks, timing, label=MODEL, probe=probe)
                for n in PREFILL_LENS]
    del phases
    (dram, best), gemm = main_memory_roofs(peaks), roofline.compute_roof(peaks["roofs"],
                                                                         cfg.dtype)
    m, decode_bw = moment_factor(decode, "memory", dram["value"]), decode["bytes_per_s"]["median"]
    out = {
        "model": MODEL, "params": costs.param_counts(cfg)["total"], "backend": cfg.backend,
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
                                                             moment_factor(p, "compute",
                                                                     gemm["value"]))
                              for p in prefills],
        "prefill_over_gemm_unscaled": [p["flops_per_s"]["median"] / gemm["value"]
                                       for p in prefills],
        "gemm_roof_spread": roofline.spread(gemm), "dram_roof_spread": roofline.spread(dram),
        "targets": TARGETS, "peer": None, "speedup_over_peer": None,
    }
    if peer:
        out["peer"] = hf_peer(cfg, DECODE_CONTEXT)
        if out["peer"].get("step_s"):
            out["speedup_over_peer"] = out["peer"]["step_s"] / decode["timing"]["median"]
            out["peer"]["bytes_per_s"] = decode["bytes"] / out["peer"]["step_s"]
    return out


# The transformers Llama of a spec (`llama_spec`), random weights, float32: the model every
# peer script (this speed report's, `microbench.studies.serve`'s) builds after reading `spec`.
LLAMA_MODEL = r"""
import torch
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=spec["V"], hidden_size=spec["D"], intermediate_size=spec["F"],
                  num_hidden_layers=spec["L"], num_attention_heads=spec["N"],
                  num_key_value_heads=spec["K"], head_dim=spec["H"], tie_word_embeddings=False,
                  max_position_embeddings=8192, torch_dtype=torch.float32)
model = LlamaForCausalLM(cfg).eval()
"""


def llama_spec(cfg: refmodel.ModelConfig) -> dict:
    """The shape `LLAMA_MODEL` builds: cfg's sizes in the shape alphabet."""
    return {"V": cfg.vocab_size, "D": cfg.d_model, "F": cfg.d_ff, "L": cfg.n_layers,
            "N": cfg.n_heads, "K": cfg.n_kv_heads, "H": cfg.resolved_head_dim}


PEER_SCRIPT = r"""
import json, sys, time
spec = json.loads(sys.argv[1])
""" + LLAMA_MODEL + r"""
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
    spec = {**llama_spec(cfg), "S": context, "steps": steps}
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
