"""Prefill/decode disaggregation in the simulator: the KV each prompt moves is the cost
model's, a hand-computed timeline, and every request finishes."""

from __future__ import annotations

import pytest

import refmodel
from refmodel import costs
from refmodel.serving import Request, workloads
from refmodel.sim import disagg
from refmodel.sim.cluster import Link
from refmodel.sim.simulator import Simulator

A, B = 0.002, 0.001  # seconds per step, per token


def per_token(plan):
    return A + B * plan.num_tokens


def prefill_sim():
    return Simulator(per_token, num_pages=64, page_size=4, policy="prefill-first",
                     prefix_cache=False)


def decode_sim():
    return Simulator(disagg.installed(per_token), num_pages=64, page_size=4,
                     token_budget=1024, prefix_cache=False)


def test_one_request_by_hand():
    link = Link("l", bandwidth=1000.0, latency=0.01)
    r = Request(0, tuple(range(20)), max_new_tokens=3, arrival=1.0)
    out = disagg.disaggregated([r], prefill_sim, decode_sim, 1, 1, lambda r: 500.0, link)
    first = 1.0 + A + 20 * B  # prefill 20 tokens
    arrive = first + 0.01 + 500.0 / 1000.0  # the KV crosses the link
    # decode side: the first token's decode (1 token), then one more decode
    expect = (first, arrive + A + B, arrive + 2 * (A + B))
    assert out["timelines"][0].token_times == pytest.approx(expect, abs=1e-12)
    assert out["transfers"][0] == {"bytes": 500.0, "seconds": pytest.approx(0.51)}


def test_kv_moved_is_the_cost_models_and_every_request_finishes():
    cfg = refmodel.presets.get("llama3-8b")
    reqs = workloads.random_requests(30, rate=20.0, prompt_len=64, output_len=8,
                                     vocab=cfg.vocab_size, seed=1)

    def kv(r):
        return costs.kv_cache_bytes(cfg, len(r.prompt), 1, "bfloat16")
    out = disagg.disaggregated(reqs, prefill_sim, decode_sim, 2, 3, kv,
                               Link("ib", 50e9, 2.7e-6))
    for r in reqs:
        moved = out["transfers"][r.id]["bytes"]
        # 32 layers x 2 (K, V) x 8 KV heads x 128 dims x 2 bytes per token
        assert moved == len(r.prompt) * 32 * 2 * 8 * 128 * 2
        t = out["timelines"][r.id]
        assert len(t.token_times) == r.max_new_tokens and t.token_times[0] >= r.arrival
    together = disagg.colocated(reqs, lambda: Simulator(per_token, num_pages=64, page_size=4,
                                                        prefix_cache=False), 2)
    assert sorted(together) == sorted(r.id for r in reqs)
    assert all(len(t.token_times) == r.max_new_tokens
               for r, t in zip(reqs, (together[r.id] for r in reqs), strict=True))


def test_deal_and_bad_input():
    reqs = [Request(i, (1,), 1, arrival=float(10 - i)) for i in range(5)]
    shares = disagg.deal(reqs, 2)
    assert [[r.id for r in s] for s in shares] == [[4, 2, 0], [3, 1]]
    with pytest.raises(ValueError, match="instances"):
        disagg.deal(reqs, 0)
