"""The quant study (microbench.studies.quant) runs each precision on the path it names or says
why not: a format the native backend refuses, or leaves to XLA, is recorded as skipped, never
timed on XLA under the native name; quick mode's weights exceed the last-level cache; the KL
divergence is the textbook one. No timing is asserted (speed is the benchmark's to measure)."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

import refmodel
from microbench.studies import quant as study
from refmodel import backends, costs, kernels, presets, quant

TINY = dataclasses.replace(study.QUICK, model="tiny", rounds=1, repeats=1, context=8,
                           prefill_len=8, xla=("float32", "int8"),
                           native=("float32", "int8", "int4 w4a8"))
NATIVE = backends.choose("auto") == "native"
needs_native = pytest.mark.skipif(not NATIVE, reason=f"no native kernels: {kernels.why_not()}")


def _refuse_int4(monkeypatch):
    """backends.use as before the int4 kernel: a ValueError for int4 weights."""
    real = backends.use

    def use(model, backend="native"):
        if model.cfg.weight_format == "int4":
            raise ValueError("backend='native' takes float32 weights or weight_format='int8'")
        return real(model, backend)

    monkeypatch.setattr(backends, "use", use)


@needs_native
def test_a_format_the_backend_refuses_is_skipped_with_its_reason(monkeypatch):
    _refuse_int4(monkeypatch)
    models, skipped = study.step_models(TINY)
    assert skipped == {("native", "int4 w4a8"): "skipped: backend='native' takes float32 "
                                                "weights or weight_format='int8'"}
    assert set(models) == {("xla", "float32"), ("xla", "int8"), ("native", "float32"),
                           ("native", "int8")}
    assert all(m.cfg.backend == "native" for (p, _), m in models.items() if p == "native")


@needs_native
def test_native_model_both_ways(monkeypatch):
    """Where backends.use takes the model, it is the native model; where it raises ValueError
    (a kernel this version lacks), the reason is recorded instead."""
    model = quant.quantize(refmodel.init(presets.get("tiny"), seed=0), weights="int8")
    got = study.native_model(lambda: model)
    assert not isinstance(got, str) and got.cfg.backend == "native"

    def refuse(model, backend="native"):
        raise ValueError("backend='native' takes no such weights")

    monkeypatch.setattr(backends, "use", refuse)
    assert study.native_model(lambda: model) == "skipped: backend='native' takes no such weights"


@needs_native
def test_matrices_left_to_xla_are_not_the_native_path(monkeypatch):
    """A native model that still holds quant.Quantized matrices would be timed on XLA's
    product: skipped, with how many."""
    monkeypatch.setattr(backends, "use", lambda model, backend="native": model)
    models, skipped = study.step_models(TINY)
    assert ("native", "int8") not in models and ("native", "int4 w4a8") not in models
    assert skipped["native", "int8"].startswith("skipped: backends.use left ")
    assert "matrices as quant.Quantized" in skipped["native", "int8"]
    assert ("native", "float32") in models  # float32 holds no Quantized matrix


def test_no_native_kernels_skips_the_whole_path(monkeypatch):
    monkeypatch.setattr(backends, "choose", lambda *a, **k: "xla")
    monkeypatch.setattr(kernels, "why_not", lambda: "no C++ compiler found")
    models, skipped = study.step_models(TINY)
    assert set(models) == {("xla", "float32"), ("xla", "int8")}
    assert skipped == {"native": "skipped: no native kernels here: no C++ compiler found"}


def test_a_w8a8_prefill_without_an_int8_dot_is_skipped():
    models = {("native", "float32"): None, ("native", "int8 w8a8"): None,
              ("xla", "float32"): None}
    setup = dataclasses.replace(TINY, kv_formats=())
    cases, skipped = study.step_cases(setup, models, dot=None)
    assert skipped == {("native", "int8 w8a8", "prefill"): "skipped: no VNNI/i8mm"}
    assert ("native", "int8 w8a8", "decode", 1, 8, "none") in cases
    cases, skipped = study.step_cases(setup, models, dot="avx512_vnni")
    assert skipped == {} and ("native", "int8 w8a8", "prefill", 1, 8, "none") in cases


def test_quick_weights_exceed_the_last_level_cache():
    llc = 32 << 20
    setup = study.quick_setup(llc)
    cfg = study.step_config(setup)
    need = study.LLC_MARGIN * llc
    assert study.weight_bytes(cfg, "int8", setup.context) >= need
    assert study.weight_bytes(cfg, "none", setup.context) >= need
    fewer = cfg.replace(n_layers=setup.layers - 1)
    assert setup.layers == 1 or study.weight_bytes(fewer, "int8", setup.context) < need
    assert study.quick_setup(0).layers == 1
    huge = study.quick_setup(1 << 50)  # no cut of the preset is large enough: all of it
    assert huge.layers == study.step_config(study.QUICK).n_layers


def test_kl_divergence():
    p = np.array([[0.7, 0.2, 0.1], [0.25, 0.25, 0.5]])
    q = np.array([[0.6, 0.3, 0.1], [0.2, 0.4, 0.4]])
    want = float(np.mean(np.sum(p * np.log(p / q), axis=-1)))
    got = study.kl_nats(jnp.log(jnp.asarray(p)) + 3.0, jnp.log(jnp.asarray(q)) - 1.0)
    assert got == pytest.approx(want, rel=1e-5)
    assert study.kl_nats(jnp.asarray(q), jnp.asarray(q)) == pytest.approx(0.0, abs=1e-7)


def test_bad_setups_name_the_field():
    with pytest.raises(ValueError, match="native=.*bfloat16"):
        dataclasses.replace(TINY, native=("float32", "bfloat16")).check()
    with pytest.raises(ValueError, match="xla=.*float32 first"):
        dataclasses.replace(TINY, xla=("int8", "float32")).check()
    with pytest.raises(ValueError, match="layers=-1"):
        dataclasses.replace(TINY, layers=-1).check()


def test_steps_rows_are_per_path_against_that_paths_float32(monkeypatch):
    _refuse_int4(monkeypatch)
    out = study.measure_steps(TINY, None, lambda what: None)
    rows = out["results"]
    paths = {r["path"] for r in rows}
    assert paths == ({"native", "xla"} if NATIVE else {"xla"})
    cfg = study.step_config(TINY)
    for r in rows:
        counted = costs.phase_costs(cfg, r["phase"], r["batch"], r["context"])["bytes"]
        assert r["bytes_ratio"] == pytest.approx(counted / r["bytes"], rel=1e-12)
        assert len(r["speedup_rounds"]) == TINY.rounds
        if r["precision"] == "float32":
            assert r["speedup"] == 1.0 and r["bytes_ratio"] == 1.0
        else:
            assert r["bytes_ratio"] > 1.5
    reasons = [s["reason"] for s in out["skipped"]]
    assert all(why.startswith("skipped: ") for why in reasons) and reasons
