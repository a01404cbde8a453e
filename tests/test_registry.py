"""Adding a variant is one file: a variant registered here, inside a test, is validated by the
config, passes the golden test, is counted by the cost model and the compiler cross-check, and
is planned by the sweeps, with no other edit anywhere."""

from __future__ import annotations

import pytest
from conftest import assert_golden, tiny

import refmodel
from microbench.phases import points, sweeps
from refmodel import attention, compiler_check, costs, registry
from refmodel.attention.gqa import GroupedQueryAttention
from refmodel.config import positive

KIND = "throwaway"


class Throwaway(GroupedQueryAttention):
    """GQA under a new name, with a validation and two option sets of its own (keyed on a
    config field GQA does not read)."""

    MEASURE = {KIND: ("context", "quick"), f"{KIND} wide": ("quick context",)}

    @classmethod
    def validate(cls, cfg, kind):
        positive("window", cfg.window)

    @classmethod
    def option_sets(cls, kind):
        return {kind: {"window": 16}, f"{kind} wide": {"window": 17}}

    @classmethod
    def label(cls, cfg, kind):
        return f"{kind} wide" if cfg.window % 2 else kind

    @classmethod
    def compiler_differences(cls, cfg, kind, phase, batch, context, native_solve=False):
        return {"nothing, by design": 0.0}


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(registry._REGISTRY, KIND, Throwaway)
    return Throwaway


def test_a_registered_variant_is_a_valid_config_and_passes_golden(registered):
    cfg = tiny(attention=KIND)
    assert KIND in attention.registered()
    with pytest.raises(ValueError, match="window=0"):
        tiny(attention=KIND, window=0)  # its own validation runs
    assert_golden(cfg, 2, 3 * cfg.window + 2, [5])


def test_a_registered_variant_is_counted_and_cross_checked(registered):
    cfg = tiny(attention=KIND)
    # the same computation as GQA, so the same counts
    assert costs.phase_costs(cfg, "decode", 2, 64) == costs.phase_costs(
        cfg.replace(attention="gqa"), "decode", 2, 64)
    labels = compiler_check.variants((KIND,))
    assert set(labels) == {f"{KIND} dense", f"{KIND} moe", f"{KIND} wide dense",
                           f"{KIND} wide moe"}
    assert labels[f"{KIND} wide dense"].window == 17
    row = compiler_check.check_one(f"{KIND} dense", cfg, refmodel.Phases(refmodel.init(cfg)),
                          "decode_attention")
    assert row["known_differences"] == {"nothing, by design": 0.0}
    assert abs(row["flops_rel_err"]) <= compiler_check.FLOP_RTOL


def test_a_registered_variant_is_swept_and_labelled(registered):
    assert {KIND, f"{KIND} wide"} <= set(sweeps.variants())
    full, quick = sweeps.PhasePlan(), sweeps.quick_plan()
    assert KIND in full.variants and KIND in full.context_variants
    assert KIND in quick.variants and quick.context_variants.count(f"{KIND} wide") == 1
    planned = {(j.variant, j.phase) for j in sweeps.jobs(quick)}
    assert {(KIND, p) for p in refmodel.PHASES} <= planned
    assert (f"{KIND} wide", "decode_attention") in planned
    wide = sweeps.config(full, f"{KIND} wide")
    assert (wide.attention, wide.window) == (KIND, 17)
    assert points.describe(wide) == f"{KIND} wide / dense"


def test_no_variant_is_left_unregistered_after_a_test():
    assert KIND not in attention.registered()
