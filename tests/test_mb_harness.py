"""Timing harness: statistics, the adaptive stopping rule (with a fake clock), donation."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from microbench import harness


def test_summarize_known_samples():
    st = harness.summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert st["median"] == 3.0 and st["min"] == 1.0 and st["n"] == 5
    assert st["p10"] == pytest.approx(1.4) and st["p90"] == pytest.approx(4.6)
    assert st["cv"] == pytest.approx(np.std([1, 2, 3, 4, 5], ddof=1) / 3.0)


def test_summarize_single_sample_and_empty():
    assert harness.summarize([2.0])["cv"] == 0.0
    with pytest.raises(ValueError):
        harness.summarize([])


@pytest.mark.parametrize("samples, elapsed, expected", [
    ([1.0, 1.0], 99.0, None),                      # below min_samples: budget cannot stop it
    ([1.0, 1.0, 1.0], 0.0, "cv"),                  # spread small enough
    ([1.0, 2.0, 3.0], 0.1, None),                  # noisy, budget left
    ([1.0, 2.0, 3.0], 5.0, "budget"),              # noisy, budget spent
    ([1.0, 2.0, 3.0, 1.0, 2.0], 0.0, "max_samples"),
])
def test_stop_reason(samples, elapsed, expected):
    got = harness.stop_reason(samples, elapsed, target_cv=0.05, budget_s=1.0, min_samples=3,
                              max_samples=5)
    assert got == expected


def _fake_clock(steps):
    t = [0.0]
    it = itertools.cycle(steps)

    def clock():
        t[0] += next(it)
        return t[0]

    return clock


def _add_one(x):
    return x + 1.0


def test_time_fn_stops_on_cv_with_steady_clock():
    x = jnp.arange(8.0)
    timing = harness.time_fn(_add_one, x, clock=_fake_clock([1e-3]), min_samples=4,
                             target_cv=0.01, min_sample_s=1e-3)
    assert timing.stop == "cv" and len(timing.samples) == 4
    assert timing.calls_per_sample == 1
    assert timing.median == pytest.approx(1e-3)


def test_time_fn_repeats_calls_to_reach_min_sample():
    # every clock read advances 0.1 ms: one call "takes" 0.1 ms, so 10 calls make a 1 ms sample
    timing = harness.time_fn(_add_one, jnp.arange(8.0), clock=_fake_clock([1e-4]),
                             min_samples=3, min_sample_s=1e-3)
    assert timing.calls_per_sample == 10
    assert timing.median == pytest.approx(1e-5)


def test_time_fn_with_before_runs_it_untimed_before_every_one_call_sample():
    """`before` (an evictor) runs before each sample, outside the clock, and a sample is one
    call even where calibration would queue ten."""
    calls = []
    clock = _fake_clock([1e-4])
    timing = harness.time_fn(_add_one, jnp.arange(8.0), clock=clock, min_samples=3,
                             min_sample_s=1e-3, target_cv=0.01,
                             before=lambda: calls.append(clock()))
    assert timing.calls_per_sample == 1 and len(calls) == len(timing.samples) == 3
    assert timing.median == pytest.approx(1e-4)  # the before's clock read is not in a sample


def test_evictor_reads_a_buffer_of_at_least_128_mib():
    ev = harness.Evictor()
    assert ev.nbytes >= 128 << 20
    ev()  # runs (a compiled read of the whole buffer)
    assert harness.Evictor(1 << 20).nbytes == 1 << 20


def test_time_fn_stops_on_budget_with_noisy_clock():
    # alternating 1 ms / 5 ms readings: CV never reaches the target, the budget ends it
    timing = harness.time_fn(_add_one, jnp.arange(8.0), clock=_fake_clock([1e-3, 5e-3]),
                             min_samples=3, target_cv=1e-6, budget_s=0.05, max_samples=10_000)
    assert timing.stop == "budget"
    assert 3 <= len(timing.samples) < 40


def test_time_fn_max_samples():
    timing = harness.time_fn(_add_one, jnp.arange(8.0), clock=_fake_clock([1e-3, 5e-3]),
                             min_samples=3, max_samples=6, target_cv=0.0, budget_s=1e9)
    assert timing.stop == "max_samples" and len(timing.samples) == 6


def test_donated_argument_is_aliased_and_callers_array_survives():
    x = jnp.arange(1024.0)
    compiled = harness.compile_fn(_add_one, x, donate_argnums=(0,))
    assert "input_output_alias" in compiled.as_text()  # output written in place
    harness.time_fn(_add_one, x, donate_argnums=(0,), min_samples=3, budget_s=0.01)
    np.testing.assert_array_equal(np.asarray(x), np.arange(1024.0))  # harness copied it


def test_donated_calls_chain_outputs_into_inputs():
    seen = []

    def step(x):
        jax.debug.callback(lambda v: seen.append(float(v)), x[0])
        return x + 1.0

    harness.time_fn(step, jnp.zeros(4), donate_argnums=(0,), warmup=1, min_samples=3,
                    budget_s=0.0, clock=_fake_clock([1e-3]))
    assert seen == [float(i) for i in range(len(seen))]  # each call saw the previous output


def test_rates_map_time_percentiles_to_rate_percentiles():
    t = harness.Timing((1.0, 2.0, 4.0), 1, "cv")
    r = harness.rates(8.0, t)
    st = t.stats
    assert r["median"] == 4.0 and r["max"] == 8.0
    assert r["p10"] == pytest.approx(8.0 / st["p90"]) and r["p90"] == pytest.approx(8.0 / st["p10"])


def test_environment_block_fields():
    env = harness.environment()
    for key in ("schema_version", "backend", "device_kind", "jax_version", "jaxlib_version",
                "xla_flags", "jax_default_matmul_precision", "cpu_model", "isa_flags",
                "affinity", "caches", "date_utc", "git_revision"):
        assert key in env, key
    assert env["backend"] == jax.default_backend()
    assert env["date_utc"].endswith("+00:00")
    assert "hostname" not in env and "node" not in env
