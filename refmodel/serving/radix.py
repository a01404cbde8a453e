"""A radix tree over token ids that maps cached prefixes to KV pages, with LRU eviction.

This is SGLang's RadixAttention (Zheng et al. 2024, "SGLang: Efficient Execution of Structured
Language Model Programs"; `mem_cache/radix_cache.py`), made page-granular like its paged
variant: every edge is a run of whole pages of tokens, so two requests share a page only when
they agree on all of its tokens and on everything before it, and sharing is copy-free (the
same page id appears in both block tables).

    match    walk from the root while the next page of tokens equals a child's first page;
             the answer is the pages along the path (a prefix of the request's KV)
    acquire  match, split the last edge at the match, lock the path (lock += 1 up to the
             root) so eviction leaves it alone while a request uses it; counts hits/misses
    insert   on completion, hang the request's remaining whole pages under the deepest match
    evict    pop the least recently used unlocked leaf until enough pages are free; a parent
             whose last child went becomes a leaf and may go next

The tree only indexes pages; the pool (pool.py) owns them. A page in the tree is marked
`cached` in the pool: while a running sequence holds it, it counts as used; when nobody does,
it counts as cached and may be evicted. Time is a logical clock (one tick per operation) so
runs are deterministic.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

from refmodel.serving.pool import PagePool

_serial = itertools.count()


@dataclass(eq=False)
class Node:
    """One edge of the tree: `key` holds its tokens (a whole number of pages), `pages` their
    page ids; `lock` counts requests using this node or a descendant."""

    key: tuple[int, ...]
    pages: list[int]
    parent: Node | None
    children: dict[tuple[int, ...], Node] = field(default_factory=dict)
    lock: int = 0
    last_access: int = 0
    serial: int = field(default_factory=lambda: next(_serial))  # heap tie-break


@dataclass(frozen=True)
class Match:
    """A locked prefix: `length` of the `total` tokens asked for (a multiple of the page
    size), held in `pages`."""

    length: int
    total: int
    pages: tuple[int, ...]
    node: Node


class RadixCache:
    """Cached prefixes of `pool`'s pages; hit and miss counts are in tokens."""

    def __init__(self, pool: PagePool):
        self.pool, self.page_size = pool, pool.page_size
        self.root = Node(key=(), pages=[], parent=None, lock=1)  # never evicted
        self.clock = 0
        self.hit_tokens = self.miss_tokens = 0
        self.evicted_pages = 0  # over the cache's life

    @property
    def hit_rate(self) -> float:
        total = self.hit_tokens + self.miss_tokens
        return self.hit_tokens / total if total else 0.0

    def _common_pages(self, node: Node, tokens: tuple[int, ...], i: int, n: int) -> int:
        """Whole pages on which `node`'s edge agrees with tokens[i:n]."""
        ps, m = self.page_size, 0
        while m < len(node.pages) and i + (m + 1) * ps <= n and \
                node.key[m * ps:(m + 1) * ps] == tokens[i + m * ps:i + (m + 1) * ps]:
            m += 1
        return m

    def _split(self, node: Node, m: int) -> Node:
        """Cut `node`'s edge after m pages; returns the new upper node."""
        ps = self.page_size
        upper = Node(key=node.key[:m * ps], pages=node.pages[:m], parent=node.parent,
                     lock=node.lock, last_access=node.last_access)
        node.parent.children[node.key[:ps]] = upper
        node.key, node.pages, node.parent = node.key[m * ps:], node.pages[m:], upper
        upper.children[node.key[:ps]] = node
        return upper

    def _walk(self, tokens: tuple[int, ...], n: int, split: bool) -> tuple[Node, int, list]:
        """Deepest node matching tokens[:n] in whole pages: (node, tokens matched, pages)."""
        node, i, pages, ps = self.root, 0, [], self.page_size
        while i + ps <= n:
            child = node.children.get(tokens[i:i + ps])
            if child is None:
                break
            m = self._common_pages(child, tokens, i, n)
            if m < len(child.pages):
                if not split:
                    return node, i + m * ps, pages + child.pages[:m]
                child = self._split(child, m)
            node, i, pages = child, i + m * ps, pages + child.pages
        return node, i, pages

    def match_length(self, tokens, limit: int | None = None) -> int:
        """Tokens of tokens[:limit] already cached; changes nothing (for admission order)."""
        tokens = tuple(tokens)
        n = len(tokens) if limit is None else min(limit, len(tokens))
        return self._walk(tokens, n, split=False)[1]

    def acquire(self, tokens, limit: int | None = None, count: bool = True) -> Match:
        """Match tokens[:limit], lock the path and (if `count`) count hits and misses over
        all of `tokens`."""
        tokens = tuple(tokens)
        n = len(tokens) if limit is None else min(limit, len(tokens))
        node, length, pages = self._walk(tokens, n, split=True)
        self.clock += 1
        if count:
            self.hit_tokens += length
            self.miss_tokens += len(tokens) - length
        for x in self._path(node):
            x.lock += 1
            x.last_access = self.clock
        return Match(length, len(tokens), tuple(pages), node)

    def release(self, match: Match, cancel: bool = False) -> None:
        """The request that acquired `match` no longer uses it; `cancel`: it never used it
        (admission fell through), so its hits and misses are taken back."""
        if cancel:
            self.hit_tokens -= match.length
            self.miss_tokens -= match.total - match.length
        for x in self._path(match.node):
            if x.lock <= 0:
                raise ValueError("release of a prefix that is not locked (released twice?)")
            x.lock -= 1

    def insert(self, tokens, pages) -> int:
        """Cache the whole pages of `tokens` (held in `pages`, in order); returns the tokens
        newly cached. Pages for tokens already in the tree are not taken: their holder keeps
        them and frees them as usual."""
        tokens, ps = tuple(tokens), self.page_size
        n = min(len(pages), len(tokens) // ps) * ps
        node, i = self.root, 0
        self.clock += 1
        while i < n:
            child = node.children.get(tokens[i:i + ps])
            if child is None:
                leaf = Node(key=tokens[i:n], pages=list(pages[i // ps:n // ps]), parent=node,
                            last_access=self.clock)
                node.children[tokens[i:i + ps]] = leaf
                self.pool.mark_cached(leaf.pages)
                return n - i
            m = self._common_pages(child, tokens, i, n)
            if m < len(child.pages):
                child = self._split(child, m)
            node, i = child, i + m * ps
            node.last_access = self.clock
        return 0

    def evict(self, n_pages: int) -> int:
        """Free at least `n_pages` pages if unlocked leaves allow, least recently used first;
        returns the pages freed."""
        heap = [(x.last_access, x.serial, x) for x in self.nodes() if self._evictable(x)]
        heapq.heapify(heap)
        freed = 0
        while freed < n_pages and heap:
            _, _, leaf = heapq.heappop(heap)
            self.pool.uncache(leaf.pages)
            freed += len(leaf.pages)
            parent = leaf.parent
            del parent.children[leaf.key[:self.page_size]]
            if self._evictable(parent):
                heapq.heappush(heap, (parent.last_access, parent.serial, parent))
        self.evicted_pages += freed
        return freed

    def _evictable(self, node: Node) -> bool:
        return node is not self.root and not node.children and node.lock == 0

    @staticmethod
    def _path(node: Node):
        while node is not None:
            yield node
            node = node.parent

    def nodes(self) -> list[Node]:
        """Every node but the root."""
        out, stack = [], list(self.root.children.values())
        while stack:
            x = stack.pop()
            out.append(x)
            stack.extend(x.children.values())
        return out

    @property
    def cached_tokens(self) -> int:
        return sum(len(x.key) for x in self.nodes())

    def check(self) -> None:
        """Assert the tree's invariants: whole-page edges keyed by their first page, locks
        no larger than the parent's, and the pool's cached set equal to the tree's pages."""
        ps, seen = self.page_size, []
        for x in self.nodes():
            assert x.pages and len(x.key) == len(x.pages) * ps, x.key
            assert x.parent.children[x.key[:ps]] is x
            assert 0 <= x.lock <= x.parent.lock, "a node is locked more than its parent"
            seen += x.pages
        assert len(seen) == len(set(seen)), "a page appears twice in the tree"
        assert set(seen) == self.pool.cached, "tree pages != the pool's cached pages"
