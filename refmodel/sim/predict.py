"""Step-time predictors for the simulator: a Plan in, seconds out.

    TableTime     measured: the seconds of each model call shape (B, T) the engine makes,
                  timed on the engine itself (`Engine.time_shapes`), summed over the step's
                  calls (`refmodel.serving.steps.plan_calls`), plus a per-step host time
    RooflineTime  counted: each call's FLOPs and bytes (`refmodel.costs.step_costs`) on a
                  Chip's roofline plus its per-call floor, plus (given `kernels` and
                  `per_kernel_s`) a measured cost per kernel times the kernels the call's
                  compiled program launches. `calls` says what is called:
                  EngineCalls, this project's engine (padded rows and tokens over a fixed
                  view of max_len, the paged view gathered and written before attention:
                  the roofline of what it actually executes); or None, an ideal fused engine
                  (one call per step over exactly the real tokens, a paged-attention kernel
                  that reads each cached token once, logits only where a token is sampled)
                  with tensor parallelism over `tp` chips (Megatron: per chip 1/tp of the
                  FLOPs and bytes, plus an all-reduce of the step's activations after every
                  attention and every FFN block over a Link; replicated norms and embeddings
                  and KV heads fewer than tp, which real engines replicate, are not modelled)

A roofline prediction is counted, not fitted: nothing here is tuned to the runs it
predicts. Without the per-kernel term it is a floor on time, and the gap to the engine is
the engine's distance from its roofs; the gap between TableTime and the engine is what the
queue adds to call-time noise. A small model's call is short enough that its kernels, not
its bytes, set its time (a hundred-odd kernels of some microseconds each, against a tenth of
a millisecond of bytes at the roofs): the per-kernel term counts them, one cost per kernel
measured on one call before any run (microbench.studies.simulate.kernel_cost) times each
call's own count.

`step_plan(step)` turns a recorded step (refmodel.serving.steps.Step: its prefill chunk
lengths and decode rows) back into a Plan of the same shape, so a predictor can price each
step an engine actually ran, one by one.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from refmodel import attention, costs
from refmodel.config import ModelConfig
from refmodel.counting import BYTES
from refmodel.serving.request import Chunk, Plan
from refmodel.serving.steps import Call, Step, plan_calls, view_pages
from refmodel.sim.cluster import Chip, Link


@dataclass(frozen=True)
class EngineCalls:
    """How this project's engine calls the model (see refmodel/serving/engine.py)."""

    has_state: bool = False
    shapes: str = "pow2"
    token_budget: int = 256
    max_running: int = 32
    max_len: int = 512  # the fixed view every call attends over (pages of max_len)
    page_size: int = 16

    @classmethod
    def of(cls, engine) -> EngineCalls:
        """The calls a given Engine makes (its layout, shapes, budget, rows and view)."""
        if engine.max_len is None:
            raise ValueError("EngineCalls.of: the engine needs max_len (a fixed view)")
        return cls(engine.layout.has_state, engine.shapes, engine.scheduler.token_budget,
                   engine.scheduler.max_running, engine.max_len, engine.pool.page_size)

    def __call__(self, plan: Plan) -> list[Call]:
        return plan_calls(plan, self.has_state, self.shapes, self.token_budget,
                          self.max_running)

    def view(self, T: int) -> int:
        """Tokens in the view of a call of T tokens (the engine's, steps.view_pages)."""
        return view_pages(self.max_len, self.page_size, T) * self.page_size


class TableTime:
    """Predict a step as the sum of its calls' measured seconds plus `host_s` per step."""

    def __init__(self, table: Mapping[tuple[int, int], float], calls: EngineCalls,
                 host_s: float = 0.0):
        self.table, self.calls, self.host_s = dict(table), calls, float(host_s)

    def __call__(self, plan: Plan) -> float:
        total = self.host_s
        for call in self.calls(plan):
            if call.shape not in self.table:
                raise KeyError(f"call shape (B, T) = {call.shape} is not in the measured "
                               f"table {sorted(self.table)}")
            total += self.table[call.shape]
        return total


class RooflineTime:
    """Predict a step from counted FLOPs and bytes on a Chip (see the module docstring)."""

    def __init__(self, cfg: ModelConfig, chip: Chip, calls: EngineCalls | None = None,
                 tp: int = 1, link: Link | None = None, weight_dtype: str | None = None,
                 kv_dtype: str | None = None, act_dtype: str | None = None,
                 host_s: float = 0.0, bandwidth_at: Callable[[float], float] | None = None,
                 kernels: Mapping[tuple[int, int], int] | Callable[[tuple[int, int]], int]
                 | None = None, per_kernel_s: float = 0.0):
        if not isinstance(tp, int) or tp < 1:
            raise ValueError(f"tp={tp!r}: must be a positive integer")
        if isinstance(per_kernel_s, bool) or not isinstance(per_kernel_s, (int, float)) or \
                not math.isfinite(per_kernel_s) or per_kernel_s < 0:
            raise ValueError(f"per_kernel_s={per_kernel_s!r}: must be a finite number >= 0")
        if per_kernel_s and (kernels is None or calls is None):
            raise ValueError(f"per_kernel_s={per_kernel_s!r} needs calls (EngineCalls) and "
                             "kernels (each call shape's kernel count)")
        if tp > 1 and link is None:
            raise ValueError(f"tp={tp}: tensor parallelism needs a link for its all-reduces")
        if tp > 1 and calls is not None:
            raise ValueError("tp > 1 models an ideal fused engine: give calls=None")
        self.cfg, self.chip, self.calls, self.tp, self.link = cfg, chip, calls, tp, link
        self.dtypes = dict(weight_dtype=weight_dtype, kv_dtype=kv_dtype, act_dtype=act_dtype)
        self.act_size = BYTES[act_dtype or cfg.dtype]
        self.kv_token = costs.kv_bytes_per_token(cfg, kv_dtype or cfg.dtype)
        self.host_s = float(host_s)
        self.bandwidth_at = bandwidth_at  # bytes/s for a call's working set (cache levels)
        # (B, T) -> kernels the compiled call launches (a table or a function of the shape)
        self.kernels = kernels.__getitem__ if isinstance(kernels, Mapping) else kernels
        self.per_kernel_s = float(per_kernel_s)
        self._memo: dict = {}

    def __call__(self, plan: Plan) -> float:
        if self.calls is None:
            chunks = [(len(c.tokens), c.start) for c in plan.prefill + plan.decode]
            return self.host_s + self.fused(tuple(chunks))
        return self.host_s + sum(self.engine_call(c.shape) for c in self.calls(plan))

    def engine_call(self, shape: tuple[int, int]) -> float:
        """Seconds of one engine call (B rows of T tokens over the fixed view): the model on
        the padded rows plus the gather that writes the view (read the pages, write the
        view: 2 x the view's KV bytes; the model's own read of the view is in its count),
        plus per_kernel_s for each kernel the call launches."""
        if shape not in self._memo:
            B, T = shape
            S = self.calls.view(T)
            c = costs.step_costs(self.cfg, [(T, S - T)] * B, **self.dtypes)
            gather = 2.0 * B * S * self.kv_token
            nbytes = c["bytes"] + gather
            if self.bandwidth_at is None:
                self._memo[shape] = self.chip.time(c["flops"], nbytes)
            else:  # weights + pages + view: the bytes the call keeps touching
                bw = self.bandwidth_at(c["weight_bytes"] + gather)
                self._memo[shape] = self.chip.floor + max(c["flops"] / self.chip.flops,
                                                          nbytes / bw)
            if self.per_kernel_s:
                self._memo[shape] += self.per_kernel_s * self.kernels(shape)
        return self._memo[shape]

    def fused(self, chunks: tuple[tuple[int, int], ...]) -> float:
        """Seconds of one fused step over exactly these (new, cached) chunks, on tp chips:
        the chip's time for `costs.step_costs(cfg, chunks, count="engine", logits="last")`
        split over tp chips, plus the all-reduces. Summed as a per-step part (embedding,
        norms, FFN or MoE at the step's tokens, LM head at its sequences, attention weights
        once) plus a per-sequence attention part memoised per (new, cached): exact (tested
        against step_costs), and fast enough for thousands of steps of an 80-layer model."""
        tokens = sum(n for n, _ in chunks)
        flops, nbytes = self._shared(tokens, len(chunks))
        for chunk in chunks:
            f, b = self._attention(chunk)
            flops, nbytes = flops + f, nbytes + b
        t = self.chip.time(flops / self.tp, nbytes / self.tp)
        if self.tp > 1:
            act = tokens * self.cfg.d_model * self.act_size
            t += self.blocks * self.link.all_reduce(act, self.tp)
        return t

    @functools.cached_property
    def blocks(self) -> int:
        """Attention and FFN blocks: each ends in an all-reduce under tensor parallelism."""
        return sum(k != "none" for k in self.cfg.layer_kinds) + \
            sum(f != "none" for f in self.cfg.layer_ffns)

    @functools.cached_property
    def _kinds(self) -> dict[str, int]:
        """Attention kind -> layers of that kind (identical layers are counted once)."""
        out: dict[str, int] = {}
        for kind in self.cfg.layer_kinds:
            if kind != "none":
                out[kind] = out.get(kind, 0) + 1
        return out

    @functools.cached_property
    def _dt(self):
        return costs.dtypes(self.cfg, **self.dtypes)

    def _attention(self, chunk: tuple[int, int]) -> tuple[float, float]:
        """FLOPs and non-weight bytes of one sequence's attention ops in every layer."""
        key = ("attention", chunk)
        if key not in self._memo:
            drop = attention.implementation_only()
            f = b = 0.0
            for kind, layers in self._kinds.items():
                for op, c in attention.get(kind).costs(self.cfg, kind, 1, *chunk,
                                                       self._dt).items():
                    if op not in drop:
                        f, b = f + layers * c.flops, b + layers * (c.kv_bytes + c.act_bytes)
            self._memo[key] = (f, b)
        return self._memo[key]

    def _shared(self, tokens: int, sequences: int) -> tuple[float, float]:
        """FLOPs and bytes of everything but the per-sequence attention part: the step of
        one chunk of `tokens` new tokens minus that chunk's attention part, with the LM
        head on `sequences` rows instead of `tokens`."""
        key = ("shared", tokens, sequences)
        if key not in self._memo:
            c = costs.step_costs(self.cfg, [(tokens, 0)], count="engine", logits="last",
                                 **self.dtypes)
            f, b = self._attention((tokens, 0))
            # that one-sequence step's head ran on 1 row; this step's on `sequences`
            one = costs.head_costs(self.cfg, 1, self._dt)
            rows = costs.head_costs(self.cfg, sequences, self._dt)
            self._memo[key] = (c["flops"] - f - one.flops + rows.flops,
                               c["bytes"] - b - one.bytes + rows.bytes)
        return self._memo[key]


def step_plan(step: Step) -> Plan:
    """A Plan of a recorded step's shape: a chunk of the same length for each prefill, one
    row per decode. Token ids and positions are placeholders (0), so it prices the step with
    an EngineCalls predictor (TableTime, RooflineTime with calls), whose calls depend only on
    those lengths, not with the ideal fused engine (calls=None), which reads positions."""
    prefill = [Chunk(seq, 0, (0,) * n, True) for seq, n in step.prefill]
    decode = [Chunk(-1 - i, 0, (0,), True) for i in range(step.decode_rows)]
    return Plan(0, prefill=prefill, decode=decode)
