"""The compiler cross-check: analytic FLOPs and bytes against XLA's own cost analysis.

For a tiny model of every option set every registered attention variant declares
(`refmodel.attention.option_sets`), dense and MoE, and every phase, this lowers and
compiles the very callables the benchmarks time (`refmodel.Phases(model).jitted[phase]`) and
reads `compiled.cost_analysis()` (a dict, a one-element list on older jax, or None).

What XLA counts and why it may differ from `refmodel.costs` (each difference is explained here
rather than loosened in a test):

- Elementwise work. The analytic constants (softmax, norms, RoPE, activations, gates) are the
  HLO elementwise ops each function executes; exp, tanh, rsqrt and the like are what XLA calls
  `transcendentals` and are kept out of FLOPs on both sides. What remains are a few FLOPs per
  row (the mean's divide in a norm, mask compares on [B, T, S] as positions are per sequence,
  the integer position arithmetic, a cumulative sum over the experts) that the model leaves
  out: well under 1% here. XLA also fuses a cheap elementwise producer into each of its
  consumers and counts it in each: the producer of a norm's sum of squares is counted twice
  (Mamba-2's gated RMSNorm recomputes the skip, the gate and the conv's bias and silu: +1.3%
  on its decode_attention).
- Gathers and scatters (embedding, KV writes at each row's own position, KV ring writes, MoE
  dispatch) and top-k: 0 FLOPs on both sides.
- MoE experts. `MoE.grouped_experts` runs each expert on its own rows in a `fori_loop` of
  ceil(rows / tile) trips of `tile` rows; XLA counts a loop body once whatever its trip count,
  so it sees every one of the E experts run on exactly one tile: E x tile rows of expert FFN
  (plus a select per element of each tile), where the code executes the B T A routed rows (plus
  padding to whole tiles). The expected compiler count adds (E tile - B T A) rows of expert
  work, by name (`EXPERT_LOOPS`): positive at decode (E tile > B T A), zero when every expert
  gets exactly one tile. (Were the experts a `jax.lax.ragged_dot`, XLA:CPU would lower it to
  a dense dot over all E experts; a native grouped kernel shows as `ragged_dot` in the HLO and
  gets no correction.)
- Other while loops (`lax.scan`) are also counted once per loop, not per iteration: the
  prefill length is chosen to fit one chunk of a chunked (linear-time) form.
- Anything particular to one attention variant (a library call XLA prices differently, such
  as a triangular solve) is that variant's `compiler_differences`, explained in its own file
  and added by name.
- Bytes: XLA sums the operands and outputs of every fused kernel it emits, so every
  intermediate that is not fused (scores, the softmax, expanded MLA keys) is counted once on
  the way out and once on the way in, and small weights are read by several kernels. The
  analytic bytes are the minimum any schedule moves. They are reported side by side, not
  asserted.

`python -m refmodel costs --check` prints the table this module builds.
"""

from __future__ import annotations

import dataclasses

import jax

import refmodel
from refmodel import attention, costs, moe
from refmodel.config import ModelConfig
from refmodel.counting import Dtypes
from refmodel.moe import MoE
from refmodel.phases import PHASES

BATCH = 2
CONTEXT = 8  # the tiny preset's linear_chunk (one chunk: scan counted once) and window
FLOP_RTOL = 0.02  # |compiler - expected| / compiler, for every variant and phase
EXPERT_LOOPS = "expert loops counted once"
# Skip LLVM's expensive passes: the HLO, hence the cost analysis, is the same (tested), and
# the 60-odd compiles of the check take about half the time.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def variants(kinds: tuple[str, ...] | None = None) -> dict[str, ModelConfig]:
    """{label: tiny config} for every option set of every registered kind (or of `kinds`),
    dense and MoE."""
    base = refmodel.presets.get("tiny")
    for kind in kinds or ():
        attention.get(kind)  # an unknown kind lists the valid ones
    return {f"{label} {ffn}": dataclasses.replace(base, ffn=ffn, **changes)
            for label, changes in attention.option_sets(kinds).items()
            for ffn in ("dense", "moe")}


def cost_analysis(compiled) -> dict | None:
    """`compiled.cost_analysis()` as a dict (None when the backend gives none)."""
    out = compiled.cost_analysis()
    if isinstance(out, (list, tuple)):
        out = out[0] if out else None
    return dict(out) if out else None


def known_differences(cfg: ModelConfig, phase: str, batch: int, context: int,
                      native_grouped: bool, native_solve: bool = False) -> dict[str, float]:
    """FLOPs the compiler counts that the analytic model leaves out by design, by reason: the
    attention variants' own (`compiler_differences`) and the MoE expert loops'."""
    out = attention.compiler_differences(cfg, phase, batch, context, native_solve)
    moe_layers = sum(f == "moe" for f in cfg.layer_ffns)
    if not native_grouped and moe_layers and phase != "decode_attention":
        tokens = batch * (context if phase == "prefill" else 1)
        pairs, E = tokens * cfg.top_k, cfg.n_experts
        ops = MoE.costs(cfg, tokens, Dtypes())
        per_row = (ops["ffn_up"].flops + ops["ffn_down"].flops) / pairs
        rows = E * moe.expert_tile(pairs, E)  # one trip of each expert's loop
        out[EXPERT_LOOPS] = moe_layers * ((rows - pairs) * per_row + rows * cfg.d_model)
    return out


def check_one(label: str, cfg: ModelConfig, phases: refmodel.Phases, phase: str,
              batch: int = BATCH, context: int = CONTEXT, fast: bool = True) -> dict:
    """One row: analytic and compiler FLOPs and bytes of one phase of one config."""
    lowered = phases.jitted[phase].lower(*phases.example_args(phase, batch, context))
    native_grouped = "ragged_dot" in lowered.as_text(dialect="stablehlo")
    compiled = lowered.compile(FAST_COMPILE if fast else None)
    native_solve = "triangular-solve(" in compiled.as_text()
    xla = cost_analysis(compiled) or {}
    analytic = costs.phase_costs(cfg, phase, batch, context)
    diffs = known_differences(cfg, phase, batch, context, native_grouped, native_solve)
    expected = analytic["flops"] + sum(diffs.values())
    flops = xla.get("flops")
    rel = None if not flops or flops < 0 else (flops - expected) / flops
    return {"variant": label, "phase": phase, "batch": batch, "context": context,
            "analytic_flops": analytic["flops"],
            "known_differences": diffs, "expected_flops": expected, "xla_flops": flops,
            "flops_rel_err": rel, "analytic_bytes": analytic["bytes"],
            "xla_bytes": xla.get("bytes accessed"),
            "xla_transcendentals": xla.get("transcendentals")}


def run(kinds: tuple[str, ...] | None = None, batch: int = BATCH,
        context: int = CONTEXT) -> list[dict]:
    """Rows for every variant (see `variants`) and phase."""
    rows = []
    for label, cfg in variants(kinds).items():
        phases = refmodel.Phases(refmodel.init(cfg, seed=0))
        rows += [check_one(label, cfg, phases, phase, batch, context) for phase in PHASES]
    return rows


def format_table(rows: list[dict]) -> str:
    """A fixed-width table of `run`'s rows, with the tolerance the tests assert."""
    head = (f"{'variant':24s} {'phase':17s} {'analytic':>11s} {'+known':>11s} "
            f"{'XLA flops':>11s} {'rel err':>8s}  {'analytic B':>11s} {'XLA bytes':>11s}")
    lines = [head, "-" * len(head)]
    for r in rows:
        rel = "n/a" if r["flops_rel_err"] is None else f"{100 * r['flops_rel_err']:+.2f}%"
        xla = "n/a" if r["xla_flops"] is None else f"{r['xla_flops']:11.0f}"
        xb = "n/a" if r["xla_bytes"] is None else f"{r['xla_bytes']:11.0f}"
        known = sum(r["known_differences"].values())
        lines.append(f"{r['variant']:24s} {r['phase']:17s} {r['analytic_flops']:11.0f} "
                     f"{known:11.0f} {xla:>11s} {rel:>8s}  {r['analytic_bytes']:11.0f} "
                     f"{xb:>11s}")
    lines.append(f"tolerance on FLOPs: |XLA - (analytic + known)| / XLA <= {FLOP_RTOL:.0%}; "
                 "'+known' = differences by design, named in each row "
                 "(see refmodel/compiler_check.py); "
                 f"bytes not asserted; "
                 f"tiny preset, batch {rows[0]['batch'] if rows else BATCH}, context "
                 f"{rows[0]['context'] if rows else CONTEXT}, backend {jax.default_backend()}")
    return "\n".join(lines)


def cache_copies(phases, batch: int, context: int) -> tuple[int, int]:
    """(copies of a whole cache array in the compiled decode step, cache arrays): a copy is a
    read and a write of that array every step, beside the reads the cost model counts. 0 when
    the donated cache is written in place (tests/test_cache_in_place.py says when it is not)."""
    import re

    args = phases.example_args("decode", batch, context)
    leaves = [x for x in jax.tree.leaves(args[-1]) if getattr(x, "ndim", 0) >= 3]
    shapes = {tuple(x.shape) for x in leaves}
    text = phases.jitted["decode"].lower(*args).compile().as_text()
    copies = re.findall(r"= \w+\[([\d,]+)\]\{[^}]*\} copy\(", text)
    return sum(tuple(int(d) for d in c.split(",")) in shapes for c in copies), len(leaves)
