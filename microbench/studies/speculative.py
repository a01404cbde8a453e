"""Speculative decoding measured: acceptance vs k, speedup measured vs predicted, the verify
step on the roofline, and where it stops paying as the batch grows.

On the trained byte-level pair (`refmodel.training`: recipes "target" and "draft"; --quick:
the seconds-trained "micro" pair), greedy, batch 1, prompts cut from the start of validation
files the models never trained on:

- every (drafter, k) generates the same tokens as plain decode (checked here, per prompt);
  its wall time is measured in interleaved rounds beside plain decode (k = 0 of the same
  loop), so a speedup is a ratio of two times measured in the same minute;
- acceptance a (proposals accepted / judged) and tokens per target pass, from the same runs;
- the prediction beside each measured speedup: `refmodel.speculative.predicted_speedup` from
  the measured a, the draft's measured step time over the target's (c), the verify pass's
  measured time over a decode step's (v_k) and the loop's fixed cost per round (o: plain
  decode's time per token in the loop over its step timed alone, minus 1); and the standard
  formula (k drafts, verify = one step, no fixed cost), which leaves out what a loop pays;
- the verify pass as a phase: counted FLOPs and bytes (`refmodel.costs.verify_costs`) over its
  measured time, on this machine's roofs (from a peaks.json);
- batch: v_k and c measured at growing batch: once the verify's k + 1 tokens per sequence make
  the step compute-bound, v_k climbs towards k + 1 and the prediction falls below 1.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import time
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from microbench import machines

DRAFTERS = ("draft", "lookup")


@dataclass(frozen=True)
class Setup:
    target: str = "target"  # recipes of refmodel.training.recipes
    draft: str = "draft"
    ks: tuple[int, ...] = (1, 2, 3, 4, 6, 8)
    drafters: tuple[str, ...] = DRAFTERS
    prompts: int = 4  # prompts, each the start of its own validation file
    prompt_len: int = 128
    new_tokens: int = 128
    rounds: int = 3  # interleaved timing rounds
    sample_temperature: float = 1.0  # one sampled run at the best greedy k (0: none)
    batches: tuple[int, ...] = (1, 4, 16, 64)
    batch_k: int = 4
    context: int = 192  # cached tokens of the step timings
    step_repeats: int = 15

    def check(self) -> None:
        from refmodel.training import recipes

        recipes.get(self.target)
        recipes.get(self.draft)
        for f in ("prompts", "prompt_len", "new_tokens", "rounds", "batch_k", "context",
                  "step_repeats"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"speculative setup: {f}={v!r} must be a positive integer")
        if not self.ks or any(not isinstance(k, int) or k < 1 for k in self.ks):
            raise ValueError(f"speculative setup: ks={self.ks!r} must be positive integers")
        if not self.batches or any(not isinstance(b, int) or b < 1 for b in self.batches):
            raise ValueError(f"speculative setup: batches={self.batches!r} must be positive")
        bad = set(self.drafters) - set(DRAFTERS)
        if bad or not self.drafters:
            raise ValueError(f"speculative setup: drafters={self.drafters!r}; choose among "
                             f"{DRAFTERS}")


QUICK = Setup(target="micro", draft="micro-draft", ks=(1, 2, 4), prompts=1, prompt_len=32,
              new_tokens=24, rounds=1, sample_temperature=1.0, batches=(1, 8), batch_k=2,
              context=32, step_repeats=3)


def prompts(n: int, length: int) -> list[np.ndarray]:
    """The first `length` tokens (BOS and bytes) of the first n validation files that long."""
    from refmodel.training import data

    val = data.load().val
    starts = np.flatnonzero(val == data.BOS)
    ends = np.append(starts[1:], val.size)
    out = [val[s:s + length].astype(np.int32)[None] for s, e in zip(starts, ends, strict=True)
           if e - s >= length]
    if len(out) < n:
        raise ValueError(f"the validation split has {len(out)} files of at least "
                         f"prompt_len={length} tokens; asked for prompts={n}")
    return out[:n]


@functools.partial(jax.jit, static_argnums=(0, 1))
def _step(graphdef, verify: bool, state, tokens, cache):
    model = nnx.merge(graphdef, state)
    return model.verify(tokens, cache)[0] if verify else model(tokens, cache)[0]


@functools.partial(jax.jit, static_argnums=0)
def _fill(graphdef, state, tokens, cache):
    return nnx.merge(graphdef, state)(tokens, cache)[1]


def step_seconds(model, batch: int, new: int, context: int, repeats: int) -> float:
    """Median seconds of one call feeding `new` tokens per sequence (1: a decode step) to a
    cache holding `context` random tokens, the speculative verify path when new > 1."""
    import refmodel

    g, state = nnx.split(model)
    rng = np.random.default_rng(0)
    cache = refmodel.init_cache(model.cfg, batch, context + new)
    prompt = jnp.asarray(rng.integers(0, model.cfg.vocab_size, (batch, context)), jnp.int32)
    cache = _fill(g, state, prompt, cache)
    tokens = jnp.asarray(rng.integers(0, model.cfg.vocab_size, (batch, new)), jnp.int32)
    jax.block_until_ready(_step(g, new > 1, state, tokens, cache))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(_step(g, new > 1, state, tokens, cache))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _describe(recipe_name: str, model) -> dict:
    from refmodel import costs
    from refmodel.training import recipes

    r = recipes.get(recipe_name)
    p = costs.param_counts(model.cfg)
    return {"recipe": r.name, "preset": r.model, "params": p["total"], "steps": r.steps,
            "tokens": r.tokens, "bytes": p["total"] * jnp.dtype(model.cfg.dtype).itemsize}


def measure(setup: Setup, roofs: dict | None = None, progress=lambda what: None) -> dict:
    """Everything the module docstring lists, as one JSON-ready dict."""
    from refmodel.training import trained

    setup.check()
    t0 = time.perf_counter()
    progress(f"models ({setup.target}, {setup.draft}; trained first if not cached)")
    target, draft = trained(setup.target), trained(setup.draft)
    texts = prompts(setup.prompts, setup.prompt_len)
    configs = [("none", 0)] + [(d, k) for d in setup.drafters for k in setup.ks]
    run = _generator(setup, target, draft)
    progress("compiling every (drafter, k), checking its tokens against plain decode")
    stats = _checked_runs(setup, target, run, configs, texts)
    seconds = {c: [] for c in configs}  # per round: total over the prompts
    for rnd in range(setup.rounds):
        progress(f"timing round {rnd + 1} of {setup.rounds}")
        for c in configs:
            seconds[c].append(sum(run(*c, p)[1] for p in texts))
    progress("step times: target and draft decode, verify of k + 1 tokens")
    steps = _step_times(setup, target, draft)
    # the loop's fixed cost per round: plain decode's time per token beyond its step's
    n_plain = sum(r.rounds for r in stats[("none", 0)])
    steps["plain_loop_s"] = statistics.median(seconds[("none", 0)]) / n_plain
    steps["overhead"] = max(0.0, steps["plain_loop_s"] / steps["target_decode_s"] - 1.0)
    runs = [_run_row(c, stats[c], seconds, steps) for c in configs]
    sampled = _sampled(setup, run, runs, texts, steps, progress)
    progress("the verify pass on the roofline")
    roofline = _verify_roofline(target.cfg, setup.context, steps)
    progress("batch: verify and draft cost relative to a target decode step")
    best_a = next((r["acceptance"] for r in runs
                   if r["drafter"] == "draft" and r["k"] == setup.batch_k), None)
    batch = _batch_rows(setup, target, draft, best_a, steps["overhead"])
    verify = steps.pop("verify")
    return {"kind": "speculative", "setup": dataclasses.asdict(setup),
            "models": {"target": _describe(setup.target, target),
                       "draft": _describe(setup.draft, draft)},
            "steps": {**steps, "verify_s": {str(k): s for k, s in verify.items()}},
            "runs": runs, "sampled": sampled, "roofline": roofline, "batch": batch,
            "batch_acceptance": best_a, "roofs": roofs, "wall_s": time.perf_counter() - t0}


def _generator(setup: Setup, target, draft):
    """run(drafter, k, prompt, temperature=0) -> (result, seconds): one generation of
    setup.new_tokens by the target with that drafter proposing k tokens, timed."""
    from refmodel import speculative as sp

    def drafter_of(name):
        return {"none": None, "draft": sp.Draft(draft), "lookup": sp.PromptLookup()}[name]

    def run(name, k, prompt, temperature=0.0):
        t = time.perf_counter()
        r = sp.generate(target, prompt, setup.new_tokens, drafter_of(name), k=k,
                        temperature=temperature, seed=0)
        return r, time.perf_counter() - t

    return run


def _checked_runs(setup: Setup, target, run, configs: list, texts: list) -> dict:
    """{(drafter, k): its greedy result per prompt}, each checked token for token against
    plain decode (these runs also compile every configuration before it is timed)."""
    import refmodel

    plain = [np.asarray(refmodel.generate(target, p, setup.new_tokens)) for p in texts]
    stats: dict[tuple, list] = {c: [] for c in configs}
    for c in configs:
        for i, p in enumerate(texts):
            r, _ = run(*c, p)
            if not np.array_equal(r.tokens, plain[i]):
                raise AssertionError(f"drafter {c[0]} k={c[1]}: greedy tokens differ from "
                                     f"plain decode on prompt {i}")
            stats[c].append(r)
    return stats


def _step_times(setup: Setup, target, draft) -> dict:
    """Batch-1 step times at setup.context: a target and a draft decode step, and the target's
    verify pass of k + 1 tokens for each k."""
    ctx, reps = setup.context, setup.step_repeats
    t_dec = step_seconds(target, 1, 1, ctx, reps)
    d_dec = step_seconds(draft, 1, 1, ctx, reps)
    verify = {k: step_seconds(target, 1, k + 1, ctx, reps) for k in setup.ks}
    return {"context": ctx, "target_decode_s": t_dec, "draft_decode_s": d_dec,
            "draft_ratio": d_dec / t_dec, "verify": verify}


def _run_row(config: tuple, results: list, seconds: dict, steps: dict) -> dict:
    """One (drafter, k): acceptance, tokens per pass, measured speedup over plain decode in
    each round and, for k > 0, the predicted speedup and the standard formula's."""
    from refmodel import speculative as sp

    drafter, k = config
    accepted = np.concatenate([r.accepted.reshape(-1) for r in results])
    judged = np.minimum(accepted + 1, k).sum() if k else 0
    a = float(accepted.sum() / judged) if k else None
    ratios = [b / s for b, s in zip(seconds[("none", 0)], seconds[config], strict=True)]
    row = {"drafter": drafter, "k": k, "temperature": 0.0, "acceptance": a,
           "tokens_per_pass": float(np.mean(accepted + 1)),
           "rounds_per_prompt": [r.rounds for r in results], "seconds": seconds[config],
           "speedup": statistics.median(ratios), "speedup_rounds": ratios}
    if k:
        v = steps["verify"][k] / steps["target_decode_s"]
        cost = 0.0 if drafter == "lookup" else steps["draft_ratio"]  # lookup runs no model
        row["verify_ratio"], row["overhead"], row["draft_ratio"] = v, steps["overhead"], cost
        row["predicted"] = sp.predicted_speedup(a, k, cost, v, steps["overhead"])
        row["standard"] = sp.expected_tokens(a, k) / (k * cost + 1.0)
    return row


def _sampled(setup: Setup, run, runs: list, texts: list, steps: dict, progress) -> dict | None:
    """One sampled run (setup.sample_temperature) of the draft model at its best greedy k:
    acceptance and speedup over plain decode sampled alike (None: not asked for)."""
    from refmodel import speculative as sp

    greedy_draft = [r for r in runs if r["drafter"] == "draft"]
    if setup.sample_temperature <= 0 or not greedy_draft:
        return None
    best = max(greedy_draft, key=lambda r: r["speedup"])
    k, temp = best["k"], setup.sample_temperature
    progress(f"sampling at temperature {temp}, k={k}")
    for p in texts:  # compile the sampling paths first
        run("draft", k, p, temp)
        run("none", 0, p, temp)
    acc, s_spec, s_plain = [], 0.0, 0.0
    for p in texts:
        r, s = run("draft", k, p, temp)
        s_spec += s
        acc.append(r.accepted.reshape(-1))
        s_plain += run("none", 0, p, temp)[1]
    accepted = np.concatenate(acc)
    a = float(accepted.sum() / np.minimum(accepted + 1, k).sum())
    return {"drafter": "draft", "k": k, "temperature": temp, "acceptance": a,
            "tokens_per_pass": float(np.mean(accepted + 1)), "speedup": s_plain / s_spec,
            "predicted": sp.predicted_speedup(a, k, steps["draft_ratio"],
                                              steps["verify"][k] / steps["target_decode_s"],
                                              steps["overhead"])}


def _verify_roofline(cfg, context: int, steps: dict) -> list[dict]:
    """The decode step (k = 0) and each verify pass: counted FLOPs and bytes over its time."""
    from refmodel import costs

    rows = []
    for k, s in [(0, steps["target_decode_s"])] + sorted(steps["verify"].items()):
        cst = costs.verify_costs(cfg, 1, context, k)
        rows.append({"k": k, "flops": cst["flops"], "bytes": cst["bytes"],
                     "weight_bytes": cst["weight_bytes"], "intensity": cst["intensity"],
                     "seconds": s, "flops_per_s": cst["flops"] / s,
                     "bytes_per_s": cst["bytes"] / s})
    return rows


def _batch_rows(setup: Setup, target, draft, best_a: float | None, overhead: float) -> list:
    """Verify (k = setup.batch_k) and draft step cost over a target decode step at each batch,
    with the speedup predicted from the batch-1 acceptance at that k."""
    from refmodel import costs
    from refmodel import speculative as sp

    ctx, reps, k = setup.context, setup.step_repeats, setup.batch_k
    rows = []
    for b in setup.batches:
        dec = step_seconds(target, b, 1, ctx, reps)
        ver = step_seconds(target, b, k + 1, ctx, reps)
        dd = step_seconds(draft, b, 1, ctx, reps)
        row = {"batch": b, "decode_s": dec, "verify_s": ver, "draft_s": dd,
               "verify_ratio": ver / dec, "draft_ratio": dd / dec}
        if best_a is not None:
            row["predicted_speedup"] = sp.predicted_speedup(best_a, k, dd / dec, ver / dec,
                                                            overhead)
        row["verify_intensity"] = costs.verify_costs(target.cfg, b, ctx, k)["intensity"]
        row["decode_intensity"] = costs.phase_costs(target.cfg, "decode", b, ctx)["intensity"]
        rows.append(row)
    return rows


def roofs_from_peaks(peaks: dict, source: str) -> dict | None:
    """The float32 GEMM roof and the DRAM read roof of a peaks.json, for the roofline panel."""
    named = {r["name"]: r["value"] for group in peaks.get("roofs", {}).values()
             if isinstance(group, list) for r in group if isinstance(r, dict) and "name" in r}
    compute = named.get("GEMM float32")
    memory = next((v for n, v in named.items() if n.lower().startswith("dram read")), None)
    if memory is None:
        memory = next((v for n, v in named.items() if n.lower().startswith("dram")), None)
    if compute is None or memory is None:
        return None
    return {"compute": compute, "memory": memory, "source": source,
            "machine": machines.result_machine(peaks),
            "names": sorted(n for n in named if n == "GEMM float32" or n.startswith("DRAM"))}
