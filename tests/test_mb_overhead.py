"""The per-call floor (microbench.roofs.overhead): kernels counted from optimised HLO text (work
launches count; parameters, constants, tuples and bitcasts do not; a while loop counts itself
and its body once), checked on hand-written text and on real compiled functions, including the
chain the per-kernel slope is measured on; and the floor's arithmetic."""

import jax
import jax.numpy as jnp
import pytest

from microbench.roofs import overhead

HLO = """\
HloModule jit_step, is_scheduled=true, entry_computation_layout={(f32[8,8]{1,0})->f32[8,8]{1,0}}

%fused_computation (param_0: f32[8,8]) -> f32[8,8] {
  %param_0 = f32[8,8]{1,0} parameter(0)
  %constant.9 = f32[] constant(2)
  %broadcast.1 = f32[8,8]{1,0} broadcast(%constant.9), dimensions={}
  ROOT %multiply.1 = f32[8,8]{1,0} multiply(%param_0, %broadcast.1)
}

%body.1 (arg: (s32[], f32[8,8])) -> (s32[], f32[8,8]) {
  %arg = (s32[], f32[8,8]{1,0}) parameter(0)
  %gte.0 = s32[] get-tuple-element(%arg), index=0
  %gte.1 = f32[8,8]{1,0} get-tuple-element(%arg), index=1
  %one = s32[] constant(1)
  %next = s32[] add(%gte.0, %one)
  %d = f32[8,8]{1,0} dot(%gte.1, %gte.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %t = (s32[], f32[8,8]{1,0}) tuple(%next, %d)
}

%body.10 (arg.2: (s32[], f32[8,8])) -> (s32[], f32[8,8]) {
  %arg.2 = (s32[], f32[8,8]{1,0}) parameter(0)
  %x0 = f32[8,8]{1,0} sine(%arg.2)
  %x1 = f32[8,8]{1,0} cosine(%x0)
  %x2 = f32[8,8]{1,0} tanh(%x1)
  ROOT %t.2 = (s32[], f32[8,8]{1,0}) tuple(%x2, %x2)
}

%cond.1 (arg.1: (s32[], f32[8,8])) -> pred[] {
  %arg.1 = (s32[], f32[8,8]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%arg.1), index=0
  %n = s32[] constant(5)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main.7 (x.1: f32[8,8], w.1: f32[8,8]) -> (f32[8,8], f32[8,8]) {
  %x.1 = f32[8,8]{1,0} parameter(0), metadata={op_name="x"}
  %w.1 = f32[8,8]{1,0} parameter(1), metadata={op_name="w"}
  %c0 = s32[] constant(0)
  %fusion.3 = f32[8,8]{1,0} fusion(%x.1), kind=kLoop, calls=%fused_computation, op="a=b"
  %dot.4 = f32[8,8]{1,0} dot(%fusion.3, %w.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %bitcast.2 = f32[64]{0} bitcast(%dot.4)
  %copy.5 = f32[8,8]{1,0} copy(%dot.4)
  %init = (s32[], f32[8,8]{1,0}) tuple(%c0, %copy.5)
  %while.6 = (s32[], f32[8,8]{1,0}) while(%init), condition=%cond.1, body=%body.1
  %res = f32[8,8]{1,0} get-tuple-element(%while.6), index=1
  ROOT %tuple.8 = (f32[8,8]{1,0}, f32[8,8]{1,0}) tuple(%res, %copy.5)
}
"""


def test_count_kernels_on_hand_written_hlo():
    got = overhead.count_kernels(HLO)
    # ENTRY: fusion, dot, copy, while; the body once: add, dot. Nothing from the fused
    # computation, the condition, or the other body whose name extends "body.1".
    assert got["by_opcode"] == {"fusion": 1, "dot": 2, "copy": 1, "while": 1, "add": 1}
    assert got["kernels"] == 6


def test_count_kernels_without_percent_names():
    # newer XLA prints names without the leading %
    text = HLO.replace("%", "")
    assert overhead.count_kernels(text) == overhead.count_kernels(HLO)


def test_free_opcodes_launch_nothing():
    text = """\
ENTRY main (p: f32[4]) -> (f32[4], f32[4]) {
  p = f32[4]{0} parameter(0)
  c = f32[4]{0} constant({1, 2, 3, 4})
  b = f32[2,2]{1,0} bitcast(p)
  ROOT t = (f32[4]{0}, f32[4]{0}) tuple(p, c)
}
"""
    assert overhead.count_kernels(text) == {"kernels": 0, "by_opcode": {}}


def _compiled(f, *args):
    return jax.jit(f).lower(*args).compile()


def test_count_kernels_on_two_dots_that_cannot_fuse():
    x = jnp.ones((8, 8), jnp.float32)
    got = overhead.count_kernels(_compiled(lambda a, b, c: jnp.tanh(a @ b) @ c, x, x, x))
    assert got["kernels"] >= 2


def test_count_kernels_on_an_elementwise_chain_is_one_fusion():
    x = jnp.ones(16, jnp.float32)
    got = overhead.count_kernels(_compiled(lambda a: jnp.sin(a) * 2 + jnp.exp(a), x))
    assert got == {"kernels": 1, "by_opcode": {"fusion": 1}}


def test_the_measured_chain_is_one_kernel_per_product():
    """The per-kernel slope assumes each 8x8 product of the chain is its own kernel."""
    m = jnp.ones((8, 8), jnp.float32)
    ws = [m] * overhead.CHAIN
    assert overhead.count_kernels(_compiled(overhead._chain, m, ws[:1]))["kernels"] == 1
    assert overhead.count_kernels(_compiled(overhead._chain, m, ws))["kernels"] == overhead.CHAIN


def test_count_kernels_counts_a_while_body_once():
    x = jnp.ones((8, 8), jnp.float32)
    loop = _compiled(lambda a: jax.lax.fori_loop(0, 5, lambda i, v: jnp.sin(v) @ v, a), x)
    one = _compiled(lambda a: jnp.sin(a) @ a, x)
    n_loop = overhead.count_kernels(loop)
    assert n_loop["by_opcode"].get("while") == 1
    # the loop itself plus at least the body's work (sin and the product) once
    assert n_loop["kernels"] >= 1 + overhead.count_kernels(one)["kernels"]


@pytest.mark.parametrize("kernels", [0, 1, 7, 1000])
def test_floor_is_dispatch_plus_kernels_times_per_kernel(kernels):
    oh = {"dispatch_s": 5e-6, "per_kernel_s": 2e-7}
    assert overhead.floor_s(oh, kernels) == pytest.approx(5e-6 + kernels * 2e-7)


def test_a_cold_floor_is_the_cold_measurement_where_the_file_has_one():
    """A cold point (caches evicted before every call) pays the cold dispatch and per-kernel
    cost; a warm one the warm; a file without the cold fields (older) gives the warm floor."""
    oh = {"dispatch_s": 5e-6, "per_kernel_s": 2e-7, "cold_dispatch_s": 7e-5,
          "cold_per_kernel_s": 4e-6}
    assert overhead.floor_s(oh, 10) == pytest.approx(5e-6 + 10 * 2e-7)
    assert overhead.floor_s(oh, 10, cold=True) == pytest.approx(7e-5 + 10 * 4e-6)
    old = {"dispatch_s": 5e-6, "per_kernel_s": 2e-7}
    assert overhead.floor_s(old, 10, cold=True) == overhead.floor_s(old, 10)


def test_measure_times_the_floor_warm_and_cold():
    """Both floors measured, as positive seconds, with the method naming the eviction; and
    without `cold` only the warm ones (what a quick caller may ask for)."""
    got = overhead.measure(budget_s=0.02)
    for key in ("dispatch_s", "cold_dispatch_s", "chain_1_s", "cold_chain_1_s"):
        assert got[key] > 0, key
    assert got["per_kernel_s"] >= 0 and got["cold_per_kernel_s"] >= 0
    assert "MiB read before every call" in got["method"]
    assert "cold_dispatch_s" not in overhead.measure(budget_s=0.02, cold=False)
