"""The engine: a Scheduler's plans run on a real model whose KV cache lives in pages.

Memory. For every layer, each leaf of the variant's cache is one of two kinds, found from the
shapes `init_cache` gives at two lengths (no variant names a kind here):

    per-token leaf  (GQA k, v; MLA latent, rope key; the sparse indexer's keys) - its token
                    axis grows with max_len. Stored as one preallocated array per leaf, the
                    leaf's own axes with the batch axis replaced by the page id and the
                    token axis by the offset in the page: GQA's k [B, K, S, H] lives in
                    [num_pages + 1, K, page_size, H] (head-major pages, as vLLM's key
                    cache). Row p is page p, the last row a scratch page that padding rows
                    write to. Token t of a sequence with block table bt lives at row
                    bt[t // page_size], offset t % page_size.
    state leaf      (a sliding window's ring, a linear layer's recurrent state and conv
                    inputs) - the same size at any length. Stored as [num_pages + 1,
                    ...leaf]: a sequence's state lives in the row of its slot's first page.

One pool of page ids pays for both (pool.py): a slot is `slot_pages` pages, enough that the
state's bytes fit in that many pages' worth of KV, so a hybrid model's budget is honest. (The
state arrays keep a row per page id for simplicity: they allocate slot_pages times more than
the budget counts. An engine tuned for memory packs state into the pages' own bytes.)

A step. For each model call the engine builds, for the B rows it runs, a contiguous view of
every cache by gathering pages through the block tables ([B, n * page_size] tokens: the
pages of max_len plus room for padding, or a power of two that covers the rows; one gather
whose output is already the variant's cache layout, so the view is written once), runs the
unchanged model on it (the variants see an ordinary `Cache` with per-row positions), and
scatters the T new tokens' KV back into their pages and the new states into their slots.
Gather-then-attend reads every cached byte once more than a contiguous cache would (a write
and a read of the view). So with the native kernels (`kernels="auto"` where they build, or
"native"), a decode call hands each layer that `backends.reads_pages` (GQA/MHA/MQA in float32 with
a plain softmax) a `PagedKV` instead: the layer writes its one new key and value into their
page and attends over the pages where they lie (`refmodel.kernels.pages`, vLLM's
PagedAttention for a CPU); other layers, and prefill chunks, get the view, gathered by the
native kernel (rows of memcpy: XLA:CPU's gather moves the same bytes several times slower)
or, with `kernels="xla"` or on an accelerator, by XLA. With `kernels="pallas"` (an
accelerator's path; interpreted on a CPU) the decode layers read their pages in place with the
Pallas paged kernel (`refmodel/pallas/paged.py`, any float cache) and views are XLA's. The
serve benchmark measures each path against `Phases`' contiguous decode.

One call per prefill chunk (B = 1, T padded to a power of two: extra causal tokens change
nothing before them; a model with state layers, whose state would absorb padding, instead
runs a chunk of 13 tokens as calls of 8, 4 and 1), and one batched call for all of a step's
decodes (B padded to a power of two; padding rows read and write the scratch page). So the
shapes are few and known in advance: `warmup()` compiles them before the clock starts.
Tokens are greedy (temperature 0) or sampled with a key per (request, token index), so a
request's tokens do not depend on its batch-mates.

Prefix caching needs the KV of a prefix to be reusable by another sequence. Pages are; a
recurrent state or a ring at the end of a prefix is not kept (SGLang keeps Mamba state
snapshots at tree nodes for this), so models with state layers run without the radix cache.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from refmodel import backends
from refmodel.kernels.pages import PagedKV, gather_pages
from refmodel.model import Transformer, init_cache
from refmodel.serving.pool import PagePool, integer
from refmodel.serving.radix import RadixCache
from refmodel.serving.request import Chunk, Plan, Request
from refmodel.serving.scheduler import Scheduler
from refmodel.serving.steps import (
    SHAPES,
    Run,
    Step,
    WallClock,
    bucket,
    call_shapes,
    plan_calls,
    serve,
    view_pages,
)


@dataclass(frozen=True)
class Leaf:
    """One cache leaf of one layer: `axis` is its token axis, None for a state leaf."""

    layer: int
    index: int  # position among the layer's flattened leaves
    axis: int | None
    shape: tuple[int, ...]  # of one sequence's leaf (batch 1) at the probe length
    dtype: str

    def page_shape(self, page_size: int) -> tuple[int, ...]:
        """One page of a per-token leaf: the leaf's axes, batch dropped, page_size tokens."""
        return tuple(page_size if k == self.axis else d for k, d in
                     enumerate(self.shape) if k)


@dataclass(frozen=True)
class Layout:
    """Where every cache leaf of a model lives in the pool's arrays (hashable: a jit key)."""

    page_size: int
    leaves: tuple[Leaf, ...]
    treedefs: tuple  # per layer: the treedef of its variant cache (None: no mixer)
    native: bool = False  # the native gather of a view on CPU (kernels/pages.py)
    pages: str | None = None  # who reads a decode layer's pages in place: "native", "pallas"

    @classmethod
    def of(cls, cfg, page_size: int, native: bool = False, pages: str | None = None) -> Layout:
        a, b = page_size, 2 * page_size
        ca = jax.eval_shape(lambda: init_cache(cfg, 1, a))
        cb = jax.eval_shape(lambda: init_cache(cfg, 1, b))
        leaves, treedefs = [], []
        for i, (la, lb) in enumerate(zip(ca.layers, cb.layers, strict=True)):
            flat_a, treedef = jax.tree.flatten(la)
            treedefs.append(treedef)
            for j, (x, y) in enumerate(zip(flat_a, jax.tree.leaves(lb), strict=True)):
                grown = [k for k in range(x.ndim) if x.shape[k] != y.shape[k]]
                if len(grown) > 1 or (grown and (x.shape[grown[0]], y.shape[grown[0]]) != (a, b)):
                    raise ValueError(f"layer {i} cache leaf {j}: shapes {x.shape} at max_len {a} "
                                     f"and {y.shape} at {b}; the engine pages a leaf whose one "
                                     "token axis has max_len entries")
                leaves.append(Leaf(i, j, grown[0] if grown else None, tuple(x.shape),
                                   str(x.dtype)))
        return cls(page_size, tuple(leaves), tuple(treedefs), native, pages)

    @property
    def has_state(self) -> bool:
        return any(leaf.axis is None for leaf in self.leaves)

    def page_bytes(self) -> int:
        """Bytes of one page: page_size tokens of every per-token leaf of every layer."""
        return sum(self.page_size * _elems(lf.shape) // lf.shape[lf.axis] * _size(lf.dtype)
                   for lf in self.leaves if lf.axis is not None)

    def state_bytes(self) -> int:
        """Bytes of one sequence's state over all layers."""
        return sum(_elems(lf.shape) * _size(lf.dtype) for lf in self.leaves if lf.axis is None)

    def slot_pages(self) -> int:
        """Pages a sequence's state slot costs in the pool's budget (1 if nothing is paged)."""
        per_page = self.page_bytes()
        return max(1, -(-self.state_bytes() // per_page)) if per_page else 1

    def allocate(self, num_pages: int) -> tuple[jax.Array, ...]:
        """Zeroed arrays, one per leaf: [rows + 1, ...page] (Leaf.page_shape) or
        [rows + 1, ...state]."""
        out = []
        for lf in self.leaves:
            page = lf.shape[1:] if lf.axis is None else lf.page_shape(self.page_size)
            out.append(jnp.zeros((num_pages + 1, *page), lf.dtype))
        return tuple(out)

    def initial_states(self, cfg) -> tuple[jax.Array | None, ...]:
        """Each state leaf of a fresh sequence (batch 1), e.g. a ring's positions of -1."""
        cache = init_cache(cfg, 1, self.page_size)
        flat = [jax.tree.leaves(layer) for layer in cache.layers]
        return tuple(flat[lf.layer][lf.index] if lf.axis is None else None
                     for lf in self.leaves)

    # ---- inside the jitted step ------------------------------------------------------------
    def gather(self, arrays, init, tables, slots, fresh, layer: int, in_place: bool = False):
        """Layer `layer`'s cache for B rows (None for a layer without a mixer): tables int32
        [B, n] page ids, slots int32 [B], fresh bool [B] (a row whose state starts from
        `init`). in_place: the layer's pages themselves, as a `PagedKV` (its key and value
        leaves), for a layer that reads them in place."""
        if self.treedefs[layer].num_leaves == 0:
            return None
        if in_place:  # a KVCache(k, v): two per-token leaves, keys first
            mine = [arr for lf, arr in zip(self.leaves, arrays, strict=True)
                    if lf.layer == layer and lf.axis is not None]
            if len(mine) != 2 or self.treedefs[layer].num_leaves != 2:
                raise ValueError(f"layer {layer} reads pages but its cache has "
                                 f"{self.treedefs[layer].num_leaves} leaves, not (k, v)")
            return PagedKV(*mine, tables, kernel=self.pages)
        B, n = tables.shape
        leaves = []
        for lf, arr, x0 in zip(self.leaves, arrays, init, strict=True):
            if lf.layer != layer:
                continue
            if lf.axis is None:
                x = arr[slots]  # [B, ...state]
                f = fresh.reshape((B,) + (1,) * (x.ndim - 1))
                x = jnp.where(f, x0.astype(x.dtype), x)
            else:
                x = gather_pages(arr, tables, lf.axis, self.native)
            leaves.append(x)
        return jax.tree.unflatten(self.treedefs[layer], leaves)

    def scatter(self, arrays: list, cache, tables, slots, start, new, T: int, layer: int):
        """Write layer `layer`'s part back into `arrays` (a list, updated): each row's `new`
        [B] tokens' KV (positions start .. start + new - 1, read from the updated contiguous
        `cache`) into their pages, and each row's state into its slot. Positions past `new`
        (padding) go to the scratch page."""
        if isinstance(cache, PagedKV):  # written in place by the layer
            mine = [k for k, lf in enumerate(self.leaves) if lf.layer == layer]
            arrays[mine[0]], arrays[mine[1]] = cache.k, cache.v
            return
        B, n = tables.shape
        ps, scratch = self.page_size, arrays[0].shape[0] - 1
        pos = start[:, None] + jnp.arange(T)  # [B, T]
        real = jnp.arange(T)[None] < new[:, None]  # [B, T]
        page = jnp.take_along_axis(tables, jnp.clip(pos // ps, 0, n - 1), axis=1)
        page, off = jnp.where(real, page, scratch), jnp.where(real, pos % ps, 0)  # [B, T]
        rows = jnp.arange(B)[:, None]
        flat = jax.tree.leaves(cache)
        for k, lf in enumerate(self.leaves):
            if lf.layer != layer:
                continue
            x, arr = flat[lf.index], arrays[k]
            if lf.axis is None:
                arrays[k] = arr.at[slots].set(x.astype(arr.dtype))
                continue
            x = jnp.moveaxis(x, lf.axis, 1)  # [B, S, ...pre, ...post]
            vals = x[rows, jnp.clip(pos, 0, x.shape[1] - 1)]  # [B, T, ...pre, ...post]
            arrays[k] = arr.at[token_index(lf, page, off)].set(vals.astype(arr.dtype))


def token_index(lf: Leaf, page, off) -> tuple:
    """Index into a leaf's page array [P, ...pre, page, ...post] of the tokens at (page, off)
    (integer arrays of one shape): arr[token_index(...)] is [...shape, ...pre, ...post]."""
    return (page, *[slice(None)] * (lf.axis - 1), off)


TRACES = [0]  # how many times a step was traced (= compiled), over the process
# How a step reads the pages: "native" (kernels/pages.py on CPU: decode attention in place
# where a layer reads pages, else the native gather of a view), "pallas" (decode attention
# in place by the Pallas paged kernel, refmodel/pallas/paged.py: the accelerators' path,
# interpreted on a CPU; views gathered by XLA), "xla" (XLA's gather of a view, every layer),
# or "auto" (native on a CPU backend where the kernels build, else xla).
KERNELS = ("auto", "native", "pallas", "xla")


@functools.lru_cache(maxsize=64)
def step_fn(graphdef, statedef, layout: Layout, greedy: bool):
    """The jitted step for one model graph and layout: `fn(weights, arrays, init, tokens,
    tables, slots, start, new, fresh, temperature, keys) -> (tokens [B], arrays)`, arrays
    donated; `weights` is the model state's leaves (`jax.tree.flatten(state)` gives them and
    `statedef`). The graph and the state's structure are bound here, once: hashing the graph
    on every call as a static argument costs more than a small model's whole decode step,
    and flattening an nnx.State (a Python pytree node per variable) costs several times what
    flattening its list of leaves does."""
    return jax.jit(functools.partial(_step, graphdef, statedef, layout, greedy),
                   donate_argnums=(1,))


def _step(graphdef, statedef, layout: Layout, greedy: bool, weights, arrays, init, tokens,
          tables, slots, start, new, fresh, temperature, keys):
    """One model call on B rows of T tokens through the pages -> (next token [B], arrays).

    tokens int32 [B, T]; tables int32 [B, n]; slots int32 [B]; start int32 [B] (position of
    each row's first token); new int32 [B] (real tokens per row, the rest is padding); fresh
    bool [B] (state starts from scratch); keys [B] PRNG keys (unused when greedy)."""
    TRACES[0] += 1
    model = nnx.merge(graphdef, jax.tree.unflatten(statedef, weights))
    B, T = tokens.shape
    arrays = list(arrays)
    # The model's own layer loop (Transformer.__call__), with each layer's view gathered
    # just before the layer and its new tokens scattered right after: one layer's view is
    # live at a time (it stays in cache), not every layer's at once. A decode call (T = 1)
    # with the native kernels gives a layer that reads pages its pages instead.
    x = model.embed_tokens(tokens, start)
    for i, block in enumerate(model.blocks):
        attn = getattr(block, "attn", None)
        in_place = (layout.pages is not None and T == 1 and attn is not None
                    and backends.reads_pages(attn, layout.pages))
        view = layout.gather(arrays, init, tables, slots, fresh, i, in_place)
        x, view = block.mix(x, start, view)
        if view is not None:
            layout.scatter(arrays, view, tables, slots, start, new, T, i)
        x = block.feed(x)
    logits = model.head(x)  # [B, T, V]
    arrays = tuple(arrays)
    logits = logits[jnp.arange(B), jnp.maximum(new - 1, 0)]  # [B, V] at each row's last token
    if greedy:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32), arrays
    scaled = (logits - logits.max(axis=-1, keepdims=True)) / temperature
    return jax.vmap(jax.random.categorical)(keys, scaled).astype(jnp.int32), arrays


class Engine:
    """A model, a page pool (+ radix cache) and a scheduler: `run(requests)` serves them.

    Bad input is a ValueError naming the field, its value and what is allowed: at
    construction, a count that is not a whole number >= 1 (zero pages, max_running=2.5,
    token_budget=True), a switch that is not a bool, a prefix cache asked of a model with
    state layers; at `run`, a prompt with ids outside the vocabulary, a request longer than
    the pool, max_len or a learned position table (a Request itself refuses float or bool
    token ids when it is made).
    """

    def __init__(self, model: Transformer, num_pages: int, page_size: int = 16,
                 policy: str = "mixed", token_budget: int = 256, max_running: int = 32,
                 prefix_cache: bool | None = None, cache_aware: bool = True,
                 max_len: int | None = None, shapes: str = "pow2", temperature: float = 0.0,
                 seed: int = 0, array_pages: int | None = None, kernels: str = "auto"):
        cfg = model.cfg
        num_pages, page_size, token_budget, max_running, max_len, array_pages, seed = \
            _check_args(num_pages=num_pages, page_size=page_size, policy=policy,
                        token_budget=token_budget, max_running=max_running,
                        prefix_cache=prefix_cache, cache_aware=cache_aware, max_len=max_len,
                        temperature=temperature, seed=seed, array_pages=array_pages)
        self.cfg, self.temperature, self.seed = cfg, float(temperature), seed
        if kernels not in KERNELS:
            raise ValueError(f"kernels={kernels!r}: choose one of {KERNELS}")
        # the page kernels read float32 pages: "auto" as for float32 weights
        self.kernels = backends.choose(kernels, name="kernels")
        in_place = self.kernels if self.kernels in ("native", "pallas") else None
        self.layout = Layout.of(cfg, page_size, native=self.kernels == "native", pages=in_place)
        state_layers = self.layout.has_state
        if prefix_cache and state_layers:
            raise ValueError(
                "prefix_cache=True: this model has layers whose cache is a state (a sliding "
                "window ring or a recurrent state), which a cached prefix cannot restore; "
                "use prefix_cache=None (auto) or False")
        self.pool = PagePool(num_pages, page_size, self.layout.slot_pages())
        use_cache = not state_layers if prefix_cache is None else prefix_cache
        self.cache = RadixCache(self.pool) if use_cache else None
        self.scheduler = Scheduler(self.pool, policy, token_budget, max_running, self.cache,
                                   cache_aware, slots=1 if state_layers else 0)
        self.graphdef, state = nnx.split(model)
        self.weights, statedef = jax.tree.flatten(state)
        self.step = step_fn(self.graphdef, statedef, self.layout, self.temperature == 0.0)
        self._temperature = jnp.float32(max(self.temperature, 1e-6))
        self._placeholder: dict[int, jax.Array] = {}
        self.init = self.layout.initial_states(cfg)
        # array_pages >= num_pages: rows allocated (a pool-size sweep keeps one array shape,
        # hence one compile, and lets the pool use only num_pages of them)
        rows = num_pages if array_pages is None else array_pages
        if rows < num_pages:
            raise ValueError(f"array_pages={array_pages!r} must be an integer >= num_pages="
                             f"{num_pages}")
        self.arrays = self.layout.allocate(rows)
        self.scratch = rows
        # One view of max_len tokens for every call (vLLM's max_model_len): one compiled
        # shape per (rows, tokens); None: the view is the rows' pages rounded up to 2^k.
        self.max_len = max_len
        self.view_pages = -(-max_len // page_size) if max_len else None
        # Shapes the model is called with (each compiles once): "pow2" pads rows, prefill
        # tokens and (without max_len) the view to powers of two; "fixed" (needs max_len)
        # pads decode rows to max_running and prefill chunks to the token budget, as a
        # CUDA-graph engine captures one shape per batch size.
        if shapes not in SHAPES:
            raise ValueError(f"shapes={shapes!r}: choose one of {SHAPES}")
        if shapes == "fixed" and max_len is None:
            raise ValueError("shapes='fixed' needs max_len (one view length for every call)")
        self.shapes = shapes
        self.steps: list[Step] = []

    # ---- requests ---------------------------------------------------------------------------
    def check(self, r: Request) -> None:
        V, total = self.cfg.vocab_size, len(r.prompt) + r.max_new_tokens
        if self.max_len is not None and total > self.max_len:
            raise ValueError(f"request {r.id}: {len(r.prompt)} prompt + {r.max_new_tokens} new "
                             f"tokens exceed the engine's max_len={self.max_len}")
        if max(r.prompt) >= V:
            raise ValueError(f"request {r.id}: prompt holds token id {max(r.prompt)}; the "
                             f"model's vocabulary is [0, {V})")
        if self.cfg.position == "learned" and len(r.prompt) + r.max_new_tokens > \
                self.cfg.max_position:
            raise ValueError(f"request {r.id}: {len(r.prompt)} prompt + {r.max_new_tokens} new "
                             f"tokens exceed max_position={self.cfg.max_position} of the "
                             "learned position embedding")

    def run(self, requests: Iterable[Request], progress: Callable[[int], None] | None = None
            ) -> Run:
        """Serve `requests` to the end. The clock is wall time since the start, jumping over
        idle gaps to the next arrival; `progress(n)` is called with tokens produced."""
        requests = list(requests)
        for r in requests:
            self.check(r)
        run = serve(self.scheduler, requests, self.execute, WallClock(), progress,
                    compiles=lambda: TRACES[0])
        self.steps.extend(run.steps)
        return run

    def _view(self, T: int) -> int | None:
        """Pages in the view of a call of T tokens with max_len set (steps.view_pages)."""
        if self.view_pages is None:
            return None
        return view_pages(self.max_len, self.pool.page_size, T)

    def warmup(self) -> int:
        """Compile every shape `run` can call with a fixed view (max_len), before the clock
        starts: decode rows and prefill lengths of each bucket, on the scratch page only.
        Returns how many shapes were compiled."""
        if self.view_pages is None:
            raise ValueError("warmup needs max_len: without it the view's length follows "
                             "the context and its shapes are not known in advance")
        before = TRACES[0]
        shapes = call_shapes(self.layout.has_state, self.shapes, self.scheduler.token_budget,
                             self.scheduler.max_running)
        for B, T in shapes:
            self._scratch_call(B, T)
        return TRACES[0] - before

    def _scratch_args(self, B: int, T: int, pages: np.ndarray | None = None,
                      tokens: np.ndarray | None = None) -> tuple:
        """The step's arguments for a call of shape (B, T) whose rows read and write the
        scratch page, or, with `pages`, the pages it names (B x view pages; each row writes
        T tokens ending at max_len, as the longest request would); `tokens` [B, T] or
        zeros."""
        s, zeros = self.scratch, np.zeros((B,), np.int32)
        tokens = np.zeros((B, T), np.int32) if tokens is None else tokens
        if pages is None:
            tables, start, new = np.full((B, self._view(T)), s, np.int32), zeros, zeros
        else:
            last = max(0, self.view_pages * self.pool.page_size - T)  # rows end at max_len
            tables, start = pages, np.full((B,), last, np.int32)
            new = np.full((B,), T, np.int32)
        return (self.weights, self.arrays, self.init, tokens, tables,
                np.full((B,), s, np.int32), start, new, np.full((B,), pages is None),
                self._temperature, self._keys(B))

    def _scratch_call(self, B: int, T: int, pages: np.ndarray | None = None,
                      tokens: np.ndarray | None = None) -> None:
        tok, self.arrays = self.step(*self._scratch_args(B, T, pages, tokens))
        np.asarray(tok)

    def compiled(self, B: int, T: int):
        """The compiled step of shape (B, T) (for counting its kernels)."""
        return self.step.lower(*self._scratch_args(B, T)).compile()

    def time_shapes(self, repeats: int = 5, seed: int = 0, shared_pages: int = 0
                    ) -> dict[tuple[int, int], list[float]]:
        """Seconds of each call shape (B, T) `run` can make, `repeats` times each, shapes
        interleaved round by round so drift spreads over all of them: the measured table a
        simulator predicts this engine's steps from. Each row reads its own pages spread
        over the whole array (a scratch-page call would read one page from cache), except
        its first `shared_pages` pages, the same for every row, as a shared system prompt's
        are; tokens are random ids (a MoE router sees them spread over its experts). It
        writes into pages: call it on an engine that has served nothing yet."""
        if self.pool.used_pages or self.pool.cached_pages:
            raise RuntimeError("time_shapes writes into pages: call it before serving")
        shapes = call_shapes(self.layout.has_state, self.shapes, self.scheduler.token_budget,
                             self.scheduler.max_running)
        rng = np.random.default_rng(seed)
        out: dict[tuple[int, int], list[float]] = {shape: [] for shape in shapes}
        for _ in range(repeats):
            for B, T in shapes:
                n = self._view(T)
                k = min(shared_pages, n)
                order = rng.permutation(self.scratch)
                own = np.resize(order[k:], B * (n - k)).reshape(B, n - k)
                pages = np.concatenate([np.tile(order[:k], (B, 1)), own], axis=1)
                pages = pages.astype(np.int32)
                # random tokens: a MoE router spreads them over experts as real text does
                tokens = rng.integers(0, self.cfg.vocab_size, (B, T), dtype=np.int32)
                t = time.perf_counter()
                self._scratch_call(B, T, pages, tokens)
                out[(B, T)].append(time.perf_counter() - t)
        return out

    # ---- one step ---------------------------------------------------------------------------
    def execute(self, plan: Plan) -> dict[int, int]:
        """Run a plan's chunks on the model; returns {sequence id: sampled token}."""
        out = [(call.chunks, self._call(list(call.chunks), call.rows, call.tokens))
               for call in self.calls(plan)]
        sampled = {}
        for chunks, tokens in out:
            tokens = np.asarray(tokens)
            for i, c in enumerate(chunks):
                if c.samples:
                    sampled[c.seq] = int(tokens[i])
        return sampled

    def calls(self, plan: Plan):
        """The model calls of `plan` (refmodel.serving.steps.plan_calls)."""
        return plan_calls(plan, self.layout.has_state, self.shapes,
                          self.scheduler.token_budget, self.scheduler.max_running)

    def _call(self, chunks: list[Chunk], B: int, T: int) -> jax.Array:
        """The jitted step on these chunks, padded to B rows of T tokens."""
        ps = self.pool.page_size
        tables = [self.pool.block_table(c.seq) for c in chunks]
        n = self._view(T) or bucket(max(max(len(t), -(-(c.start + T) // ps))
                                        for c, t in zip(chunks, tables, strict=True)))
        tok = np.zeros((B, T), np.int32)
        tab = np.full((B, n), self.scratch, np.int32)
        slots = np.full((B,), self.scratch, np.int32)
        start, new = np.zeros((B,), np.int32), np.zeros((B,), np.int32)
        fresh = np.ones((B,), bool)
        seqs = {s.id: s for s in self.scheduler.running}
        index = np.zeros((B,), np.int32)
        for i, (c, table) in enumerate(zip(chunks, tables, strict=True)):
            tok[i, :len(c.tokens)] = c.tokens
            tab[i, :len(table)] = table
            start[i], new[i], fresh[i] = c.start, len(c.tokens), c.start == 0
            if self.layout.has_state:
                slots[i] = self.pool.slot_table(c.seq)[0][0]
            seq = seqs[c.seq]
            index[i] = c.start + len(c.tokens) - len(seq.request.prompt)  # output token index
        if self.temperature == 0.0:
            keys = self._keys(B)
        else:
            ids = np.zeros((B,), np.uint32)
            ids[:len(chunks)] = [c.seq for c in chunks]
            keys = _request_keys(jax.random.key(self.seed), ids, index.astype(np.uint32))
        token, self.arrays = self.step(self.weights, self.arrays, self.init, tok, tab, slots,
                                       start, new, fresh, self._temperature, keys)
        return token

    def _keys(self, B: int) -> jax.Array:
        """Placeholder keys of B rows for greedy steps (made once per B)."""
        if B not in self._placeholder:
            self._placeholder[B] = jax.random.split(jax.random.key(0), B)
        return self._placeholder[B]


def _check_args(**args) -> tuple:
    """The Engine's arguments checked at construction, each error naming the field, its value
    and what is allowed: counts are integers (a float such as max_running=2.5 is refused, not
    rounded; a bool is not a count), switches are bools, the temperature a finite number.
    Returns the counts as Python ints: num_pages, page_size, token_budget, max_running,
    max_len, array_pages (None stays None), seed."""
    counts = [integer(name, args[name]) for name in ("num_pages", "page_size", "token_budget",
                                                      "max_running")]
    counts += [None if args[name] is None else integer(name, args[name])
               for name in ("max_len", "array_pages")]
    counts.append(integer("seed", args["seed"], minimum=None))
    for name, allowed in (("prefix_cache", (True, False, None)), ("cache_aware", (True, False))):
        if not any(args[name] is a for a in allowed):
            raise ValueError(f"{name}={args[name]!r}: choose one of {allowed}")
    t = args["temperature"]
    if isinstance(t, bool) or not isinstance(t, (int, float, np.integer, np.floating)) or \
            not math.isfinite(t) or t < 0:
        raise ValueError(f"temperature={t!r} must be a finite number >= 0 (0: greedy)")
    if not isinstance(args["policy"], str):
        raise ValueError(f"policy={args['policy']!r}: must be a name (str)")
    return tuple(counts)


@jax.jit
def _request_keys(key, ids, index):
    """One key per row from (request id, output token index): batch-mates do not matter."""
    return jax.vmap(lambda i, j: jax.random.fold_in(jax.random.fold_in(key, i), j))(ids, index)


def _elems(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


def _size(dtype: str) -> int:
    return jnp.dtype(dtype).itemsize
