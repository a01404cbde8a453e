"""The explorer page's data: every model's counts from `refmodel.costs`, every chip's roofs, and
the measured phase points, written at book build time into one script the page loads
(`_static/explorer-data.js`, read by `book/explorer.js`; the page itself: `explorer_page.py`).

What the page can display, and why each number equals `refmodel.costs.phase_costs`:

- **Precision.** A count is `phase_costs(cfg, phase, B, S, weight_dtype=w, kv_dtype=k,
  count="engine")`, activations in the model's own dtype (as `microbench.phases.sweeps.
  step_time` counts a real preset on a spec chip). FLOPs and activation bytes do not depend on
  w or k, weight bytes only on w, KV bytes only on k, so five calls pairing the five weight
  formats with the five KV formats give all 25 combinations, summed in the page
  (bytes = weight + KV + activation). The generator checks the split: FLOPs and activation
  bytes equal across the five calls, and one crossed pair per model and phase reproduced.
- **Batch.** Where a phase's every count is affine in the batch B (weights read once, every
  other term per sequence or per token), the file keeps f(1) and f(2) - f(1) for each count,
  checked at B = BATCH_MAX, and the page computes f(B) at any integer B up to BATCH_MAX (exact
  up to float64 rounding). An MoE FFN is not affine (the weights read follow the expected
  number of distinct experts the tokens touch; the dispatch sorts them): such a phase keeps
  every batch of the grid BATCHES and the page snaps B to the nearest one and shows it.
- **Context.** Counts are kept at the contexts of CONTEXTS (powers of two); the page snaps the
  context to the nearest one (in log scale) and shows the context it counted at. Decode FFN
  does not read the cache: it is counted once, at context 0, as notebook 03 counts it.
- **Chips** only move the roofs: a spec chip's peak for the weight format (else its highest,
  `microbench.roofline.spec_roofs`) and main-memory bandwidth; a measured machine's GEMM roof
  of that format (else its best, `roofline.compute_roof`) and main memory's read-only roof.

The counts take about 25 CPU-seconds (two processes) and are kept in
build/book/explorer-counts.json, keyed by the sources of refmodel/ and of this file: a rebuild
that changed neither reuses them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DTYPES = ("float32", "bfloat16", "float8", "int8", "int4")  # weight and KV formats offered
BATCHES = tuple(2**i for i in range(11))  # 1 .. 1024: the batch grid of an MoE model
BATCH_MAX = BATCHES[-1]
CONTEXTS = tuple(2**i for i in range(6, 18))  # 64 .. 131072 tokens
TOKENS = tuple(2**i for i in range(28))  # every B x S of the two grids: an MoE FFN's inputs
VARIANT_MODEL = "bench"  # the measured model: its attention variants and MoE setting
SEP = " · "


def models() -> dict:
    """{key: ModelConfig}: every preset, then the measured model's variants
    (microbench.phases.sweeps.variants: each attention option set and the MoE FFN)."""
    from microbench.phases import sweeps
    from refmodel import presets

    out = {name: presets.get(name) for name in presets.names()}
    base = presets.get(VARIANT_MODEL)
    for label, changes in sweeps.variants().items():
        out[f"{VARIANT_MODEL}{SEP}{label}"] = dataclasses.replace(base, **changes)
    return out


def _calls(cfg, phase: str, batch: int, context: int) -> dict:
    """One count: {"f": FLOPs, "a": activation bytes, "w": [weight bytes per DTYPES],
    "k": [KV bytes per DTYPES]} from five phase_costs calls pairing the formats."""
    from refmodel import costs

    rows = [costs.phase_costs(cfg, phase, batch, context, weight_dtype=d, kv_dtype=d,
                              count="engine") for d in DTYPES]
    for r in rows[1:]:
        if r["flops"] != rows[0]["flops"] or r["act_bytes"] != rows[0]["act_bytes"]:
            raise ValueError(f"{cfg.name} {phase} B={batch} S={context}: FLOPs or activation "
                             "bytes depend on the weight or KV format; the page's split fails")
    return {"f": rows[0]["flops"], "a": rows[0]["act_bytes"],
            "w": [r["weight_bytes"] for r in rows], "k": [r["kv_bytes"] for r in rows]}


def _check_crossed(cfg, phase: str, context: int) -> None:
    """Weight bytes follow the weight format alone and KV bytes the KV format alone: one
    crossed pair (bfloat16 weights, int8 cache) reproduced from the paired calls."""
    from refmodel import costs

    c = costs.phase_costs(cfg, phase, 1, context, weight_dtype="bfloat16", kv_dtype="int8",
                          count="engine")
    row = _calls(cfg, phase, 1, context)
    w, k = row["w"][DTYPES.index("bfloat16")], row["k"][DTYPES.index("int8")]
    if (c["weight_bytes"], c["kv_bytes"]) != (w, k):
        raise ValueError(f"{cfg.name} {phase}: weight bytes depend on the KV format or KV bytes "
                         "on the weight format; the page's split fails")


def _affine(one: dict, two: dict) -> dict:
    """f(1) and the slope f(2) - f(1) of each count."""
    return {key: [one[key], _sub(two[key], one[key])] for key in one}


def _sub(a, b):
    return [x - y for x, y in zip(a, b, strict=True)] if isinstance(a, list) else a - b


def _add(a, b):
    return [x + y for x, y in zip(a, b, strict=True)] if isinstance(a, list) else a + b


def _at(coeffs: dict, n: int) -> dict:
    """An affine count at n (batch or tokens)."""
    return {key: _add(c0, [(n - 1) * x for x in c1] if isinstance(c1, list) else (n - 1) * c1)
            for key, (c0, c1) in coeffs.items()}


def _diff(a: dict, *bs: dict) -> dict:
    out = dict(a)
    for b in bs:
        out = {key: _sub(out[key], b[key]) for key in out}
    return out


def _close(a: dict, b: dict) -> bool:
    flat = [(x, y) for key in a for x, y in zip(*(
        (a[key], b[key]) if isinstance(a[key], list) else ([a[key]], [b[key]])), strict=True)]
    return all(math.isclose(x, y, rel_tol=1e-12, abs_tol=1e-6) for x, y in flat)


def _affine_in_batch(cfg, name: str, whole, parts=lambda n: []) -> dict:
    """The affine coefficients of a piece = whole(n) - the other parts(n) (n: batch or
    tokens), checked where it matters: the piece plus the parts at n = BATCH_MAX equal the
    whole there. ValueError if not (a new term that is not per sequence, per token or once per
    call)."""
    def piece(n):
        return _diff(whole(n), *parts(n))
    coeffs = _affine(piece(1), piece(2))
    if not _close(_add_counts(_at(coeffs, BATCH_MAX), *parts(BATCH_MAX)), whole(BATCH_MAX)):
        raise ValueError(f"{cfg.name}: {name} is not affine in the batch; book/explorer.py "
                         "keeps only f(1) and the slope of it")
    return coeffs


def model_counts(cfg) -> dict:
    """The pieces the page sums into every phase (see `phase_at`), each checked."""
    ffn = [_calls(cfg, "decode_ffn", t, 0) for t in TOKENS]
    ffn_coeffs = _affine(ffn[0], ffn[1])
    affine = all(_close(_at(ffn_coeffs, t), f) for t, f in zip(TOKENS, ffn, strict=True))
    ffn_of = (lambda t: _at(ffn_coeffs, t)) if affine else (lambda t: ffn[TOKENS.index(t)])
    att = [_affine_in_batch(cfg, f"decode attention at context {s}",
                            lambda b, s=s: _calls(cfg, "decode_attention", b, s))
           for s in CONTEXTS]
    s0 = CONTEXTS[0]
    ends = _affine_in_batch(cfg, "the embedding, final norm and head",
                            lambda t: _calls(cfg, "decode", t, s0),
                            lambda t: [_at(att[0], t), ffn_of(t)])
    mix = [_affine_in_batch(cfg, f"prefill's mixers at context {s}",
                            lambda b, s=s: _calls(cfg, "prefill", b, s),
                            lambda b, s=s: [ffn_of(b * s), _at(ends, b * s)])
           for s in CONTEXTS]
    out = {"ffn": {"affine": affine, "v": ffn_coeffs if affine else ffn}, "ends": ends,
           "att": att, "mix": mix}
    for phase in _phases():  # the sums against phase_costs at the grid's corners
        for b, s in ((1, CONTEXTS[-1]), (BATCH_MAX, s0), (BATCHES[3], CONTEXTS[4])):
            if not _close(phase_at(out, phase, b, s), _calls(cfg, phase, b, s)):
                raise ValueError(f"{cfg.name} {phase} B={b} S={s}: the page's sum differs "
                                 "from refmodel.costs.phase_costs")
    _check_crossed(cfg, "decode", s0)
    return out


def phase_at(m: dict, phase: str, batch: int, context: int) -> dict:
    """A phase's counts from the pieces, as the page sums them: decode FFN is the FFN of B
    tokens; decode attention the mixers at context S; the decode step both plus the ends
    (embedding, final norm, LM head) of B tokens; prefill the mixers of B prompts of S tokens
    plus the FFN and the ends of B S tokens."""
    def ffn(t):
        return _at(m["ffn"]["v"], t) if m["ffn"]["affine"] else m["ffn"]["v"][TOKENS.index(t)]
    if phase == "decode_ffn":
        return ffn(batch)
    i = CONTEXTS.index(context)
    if phase == "decode_attention":
        return _at(m["att"][i], batch)
    if phase == "decode":
        return _add_counts(_at(m["att"][i], batch), ffn(batch), _at(m["ends"], batch))
    t = batch * context
    return _add_counts(_at(m["mix"][i], batch), ffn(t), _at(m["ends"], t))


def _add_counts(*parts: dict) -> dict:
    out = parts[0]
    for p in parts[1:]:
        out = {key: _add(out[key], p[key]) for key in out}
    return out


def model_entry(key: str, cfg) -> dict:
    """Everything the page needs of one model: its counted pieces, its weights in memory per
    format (parameters x bytes, as sweeps.weight_fit: scales left out), its KV bytes per token
    and per sequence at each context (the cache is linear in the batch: checked)."""
    from refmodel import costs, counting, presets

    params = costs.param_counts(cfg)["total"]
    kv_seq = [[costs.kv_cache_bytes(cfg, s, 1, d) for s in CONTEXTS] for d in DTYPES]
    if costs.kv_cache_bytes(cfg, CONTEXTS[0], 1000, "bfloat16") != 1000 * kv_seq[1][0]:
        raise ValueError(f"{key}: the KV cache is not linear in the batch; fix the fit rule")
    return {"label": key, "params": params, "act_dtype": cfg.dtype,
            "source": presets.source(key.split(SEP)[0]),
            "weights": [params * counting.BYTES[d] for d in DTYPES],
            "kv_per_token": [costs.kv_bytes_per_token(cfg, d) for d in DTYPES],
            "kv_seq": kv_seq, **model_counts(cfg)}


def _phases() -> tuple:
    from refmodel.phases import PHASES
    return PHASES


def _source_key() -> str:
    """A hash of the code the counts come from: refmodel/ and this file."""
    h = hashlib.sha256()
    for path in sorted((ROOT / "refmodel").rglob("*.py")) + [Path(__file__)]:
        h.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _entry(key: str) -> dict:
    return model_entry(key, models()[key])


def counts(cache: Path) -> dict:
    """{model key: model_entry}, from the cache when its key is current."""
    key = _source_key()
    if cache.exists():
        kept = json.loads(cache.read_text(encoding="utf-8"))
        if kept.get("key") == key:
            return kept["models"]
    keys = list(models())
    with ProcessPoolExecutor(min(2, os.cpu_count() or 1)) as pool:  # models are independent
        out = dict(zip(keys, pool.map(_entry, keys), strict=True))
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(".tmp")
    tmp.write_text(json.dumps({"key": key, "models": out}, separators=(",", ":")),
                   encoding="utf-8")
    tmp.replace(cache)
    return out
