"""The radix prefix cache: page-granular matching, edge splits, locks, LRU eviction, hit
counts, and the pool invariant after any sequence of operations."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refmodel.serving.pool import OutOfPages, PagePool
from refmodel.serving.radix import RadixCache


def held(pool: PagePool, seq: int, tokens) -> list[int]:
    """Open `seq`, hold KV pages for `tokens`, return its block table."""
    pool.open(seq)
    pool.append(seq, len(tokens))
    return pool.block_table(seq)


def cache_of(pool: PagePool, cache: RadixCache, seq: int, tokens) -> None:
    """A request that ran alone and finished: its whole pages go into the tree."""
    cache.insert(tokens, held(pool, seq, tokens))
    pool.close(seq)


def test_match_is_page_granular_and_splits_edges():
    pool = PagePool(16, page_size=4)
    cache = RadixCache(pool)
    a = list(range(12))
    cache_of(pool, cache, 1, a + [99, 98])  # the last two tokens are not a whole page
    assert cache.cached_tokens == 12 and pool.check()["cached"] == 3
    assert cache.match_length(a[:10]) == 8
    assert cache.match_length(a[:6] + [50] * 6) == 4
    assert cache.match_length(a, limit=11) == 8
    assert cache.match_length([5] + a) == 0
    b = a[:4] + [50] * 8
    cache_of(pool, cache, 2, b)  # shares one page with a, then branches
    assert sorted(len(x.key) for x in cache.nodes()) == [4, 8, 8]
    assert cache.cached_tokens == 20 and pool.check()["cached"] == 5
    cache.check()


def test_insert_keeps_the_tree_page_and_leaves_the_duplicate_to_its_holder():
    pool = PagePool(8, page_size=2)
    cache = RadixCache(pool)
    cache_of(pool, cache, 1, [1, 2, 3, 4])
    pages = held(pool, 2, [1, 2, 3, 4, 5, 6])  # computed the same prefix again
    assert cache.insert([1, 2, 3, 4, 5, 6], pages) == 2
    pool.close(2)
    assert pool.check() == {"free": 5, "used": 0, "cached": 3}  # 2 duplicates freed
    cache.check()


def test_acquire_counts_hits_and_locks_against_eviction():
    pool = PagePool(8, page_size=2)
    cache = RadixCache(pool)
    cache_of(pool, cache, 1, [1, 2, 3, 4])
    cache_of(pool, cache, 2, [7, 7, 7, 7])
    m = cache.acquire([1, 2, 3, 4, 5, 6])
    assert (m.length, len(m.pages), cache.hit_tokens, cache.miss_tokens) == (4, 2, 4, 2)
    assert cache.hit_rate == pytest.approx(4 / 6)
    assert cache.evict(8) == 2  # only the unlocked prefix [7, 7, 7, 7] can go
    assert cache.match_length([1, 2, 3, 4]) == 4 and cache.match_length([7, 7]) == 0
    cache.release(m)
    assert cache.evict(8) == 2 and pool.check() == {"free": 8, "used": 0, "cached": 0}
    with pytest.raises(ValueError, match="not locked"):
        cache.release(m)


def test_cancelled_acquire_takes_back_its_counts():
    pool = PagePool(4, page_size=2)
    cache = RadixCache(pool)
    cache_of(pool, cache, 1, [1, 2])
    cache.release(cache.acquire([1, 2, 3]), cancel=True)
    assert (cache.hit_tokens, cache.miss_tokens, cache.hit_rate) == (0, 0, 0.0)


def test_eviction_is_least_recently_used_leaf_first():
    pool = PagePool(8, page_size=2)
    cache = RadixCache(pool)
    cache_of(pool, cache, 1, [1, 1, 2, 2])
    cache_of(pool, cache, 2, [1, 1, 3, 3])  # splits: [1, 1] -> {[2, 2], [3, 3]}
    cache_of(pool, cache, 3, [4, 4])
    cache.release(cache.acquire([1, 1, 2, 2]))  # touch the first branch
    assert cache.evict(1) == 1 and cache.match_length([1, 1, 3, 3]) == 2  # [3, 3] went
    assert cache.evict(1) == 1 and cache.match_length([4, 4]) == 0
    assert cache.evict(2) == 2 and cache.nodes() == []  # a leaf, then its bare parent
    assert pool.check()["free"] == 8


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 3), st.integers(2, 12),
       st.lists(st.tuples(st.sampled_from(["start", "finish", "abort", "evict"]),
                          st.lists(st.integers(0, 1), min_size=1, max_size=9),
                          st.integers(0, 5)), max_size=30))
def test_no_page_leaks_under_random_operations(page_size, num_pages, ops):
    """Requests start (acquire a prefix, hold pages for the rest, evicting when short),
    finish (insert, release, free) or abort (release, free); evict runs at random. After
    every step every page is free, used by a live request, or cached in the tree."""
    pool = PagePool(num_pages, page_size)
    cache = RadixCache(pool)
    live: dict[int, tuple] = {}  # seq -> (tokens, match)
    for i, (op, tokens, k) in enumerate(ops):
        if op == "start":
            m = cache.acquire(tokens)
            pool.open(i, m.pages)
            need = pool.pages_needed(i, len(tokens) - m.length)
            cache.evict(need - pool.free_pages)
            try:
                pool.append(i, len(tokens) - m.length)
                live[i] = (tokens, m)
            except (OutOfPages, ValueError):
                cache.release(m, cancel=True)
                pool.close(i)
        elif op in ("finish", "abort") and live:
            seq = sorted(live)[k % len(live)]
            tokens, m = live.pop(seq)
            if op == "finish":
                cache.insert(tokens, pool.block_table(seq))
            cache.release(m)
            pool.close(seq)
        elif op == "evict":
            cache.evict(k)
        counts = pool.check()
        cache.check()
        in_use = {p for s in live for p in pool.block_table(s)}
        assert counts["used"] == len(in_use)
        assert counts["cached"] == len(pool.cached - in_use)
        assert sum(counts.values()) == num_pages
    for seq, (_, m) in live.items():
        cache.release(m)
        pool.close(seq)
    assert pool.check()["used"] == 0 and all(r == 0 for r in pool.ref)
    cache.evict(num_pages)
    assert pool.check() == {"free": num_pages, "used": 0, "cached": 0}
