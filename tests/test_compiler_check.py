"""The analytic FLOPs of every variant and phase against XLA's cost analysis of the jitted phase.

Every registered attention kind is covered automatically (MLA absorbed and naive, linear with
both rules). To keep compiles few, each kind runs all four phases with the dense FFN, and the
MoE FFN runs its three phases once (on GQA): `costs` sums a layer's mixer and FFN separately
(asserted below), so a kind's MoE rows add nothing the two sets do not check, and decode_ffn
does not depend on the kind at all. `python -m refmodel costs --check` prints the full matrix.

Tolerance: |XLA - (analytic + known differences)| / XLA <= compiler_check.FLOP_RTOL (2%). The
known differences and the few FLOPs per row the model leaves out are explained in
refmodel/compiler_check.py.
"""

from __future__ import annotations

import dataclasses

import pytest

import refmodel
from refmodel import compiler_check, costs

VARIANTS = {label: cfg for label, cfg in compiler_check.variants().items()
            if label.endswith("dense")}
DENSE_PHASES = ("prefill", "decode_attention", "decode")
MOE_PHASES = ("prefill", "decode_ffn", "decode")


@pytest.fixture(scope="module")
def phases_of():
    cache = {}

    def get(cfg):
        if cfg not in cache:
            cache[cfg] = refmodel.Phases(refmodel.init(cfg, seed=0))
        return cache[cfg]

    return get


@pytest.fixture(scope="module")
def row_of(phases_of):
    """compiler_check.check_one's row (fast compile) of one variant and phase, each once."""
    rows = {}

    def get(label, cfg, phase):
        if (label, cfg, phase) not in rows:
            rows[label, cfg, phase] = compiler_check.check_one(label, cfg, phases_of(cfg), phase)
        return rows[label, cfg, phase]

    return get


def assert_row(row):
    assert row["xla_flops"] is not None and row["xla_flops"] > 0, row
    assert abs(row["flops_rel_err"]) <= compiler_check.FLOP_RTOL, compiler_check.format_table([row])


@pytest.mark.parametrize("phase", DENSE_PHASES)
@pytest.mark.parametrize("label", VARIANTS)
def test_dense_flops_match_compiler(label, phase, row_of):
    cfg = VARIANTS[label]
    assert_row(row_of(label, cfg, phase))


def test_decode_ffn_matches_compiler_and_ignores_attention(phases_of):
    cfg = VARIANTS["gqa dense"]
    assert_row(compiler_check.check_one("gqa dense", cfg, phases_of(cfg), "decode_ffn"))
    for other in VARIANTS.values():
        assert costs.phase_costs(other, "decode_ffn", 2, 8) == costs.phase_costs(
            cfg, "decode_ffn", 2, 8)


@pytest.mark.parametrize("phase", MOE_PHASES)
def test_moe_flops_match_compiler(phase, phases_of):
    """XLA counts each expert's loop once (E tiles): the check adds that, by name. At decode
    (2 tokens x top-2 = 4 rows, 8 experts of 1-row tiles) it is 4 extra rows per layer; in
    prefill (32 rows, 4-row tiles) every expert gets exactly one tile and nothing is added
    but the tiles' selects."""
    cfg = dataclasses.replace(VARIANTS["gqa dense"], ffn="moe")
    row = compiler_check.check_one("gqa moe", cfg, phases_of(cfg), phase)
    assert_row(row)
    known = row["known_differences"].get(compiler_check.EXPERT_LOOPS, 0)
    rows = {"prefill": 0, "decode_ffn": 4, "decode": 4}[phase] * cfg.n_layers
    assert known >= rows * 2 * 3 * cfg.d_model * cfg.expert_width


@pytest.mark.parametrize("label", VARIANTS)
def test_moe_costs_are_mixer_plus_ffn(label):
    """A kind's MoE phase = its dense phase - the dense FFN + the MoE FFN, op by op."""
    dense = VARIANTS[label]
    moe = dataclasses.replace(dense, ffn="moe")
    dt = costs.dtypes(dense)
    for phase in refmodel.PHASES:
        got = costs.phase_ops(moe, phase, 2, 8, dt)
        want = dict(costs.phase_ops(dense, phase, 2, 8, dt))
        if phase != "decode_attention":
            for op, c in costs.phase_ops(dense, "decode_ffn", 2 * (8 if phase == "prefill"
                                                                   else 1), 0, dt).items():
                want[op] = want[op] + c * -1
            for op, c in costs.phase_ops(moe, "decode_ffn", 2 * (8 if phase == "prefill"
                                                                 else 1), 0, dt).items():
                want[op] = want.get(op, c * 0) + c
        for op in set(got) | set(want):
            g, w = got.get(op), want.get(op)
            g = g.as_dict() if g else {}
            w = w.as_dict() if w else {}
            for k in set(g) | set(w):
                assert g.get(k, 0) == pytest.approx(w.get(k, 0), rel=1e-9, abs=1e-6), (phase, op)


def test_cost_analysis_shapes_and_fast_compile(phases_of, row_of):
    """cost_analysis may be a dict, a one-element list or None; the fast compile options
    leave the HLO, hence the count, unchanged."""

    class Fake:
        def __init__(self, out):
            self.out = out

        def cost_analysis(self):
            return self.out

    assert compiler_check.cost_analysis(Fake([{"flops": 3.0}])) == {"flops": 3.0}
    assert compiler_check.cost_analysis(Fake({"flops": 3.0})) == {"flops": 3.0}
    assert compiler_check.cost_analysis(Fake(None)) is None
    assert compiler_check.cost_analysis(Fake([])) is None
    cfg = VARIANTS["gqa dense"]
    fast = row_of("gqa dense", cfg, "decode_attention")  # fast=True, the default
    slow = compiler_check.check_one("gqa", cfg, phases_of(cfg), "decode_attention", fast=False)
    assert fast["xla_flops"] == slow["xla_flops"]


def test_table_names_every_row():
    rows = [{"variant": "x", "phase": "decode", "batch": 2, "context": 8,
             "analytic_flops": 10.0, "known_differences": {}, "expected_flops": 10.0,
             "xla_flops": 11.0, "flops_rel_err": 1 / 11, "analytic_bytes": 5.0,
             "xla_bytes": 7.0, "xla_transcendentals": 0.0}]
    table = compiler_check.format_table(rows)
    assert "x" in table and "+9.09%" in table and f"{compiler_check.FLOP_RTOL:.0%}" in table
