"""The paged KV memory pool's accounting: which page belongs to whom. No arrays live here.

The design is vLLM's PagedAttention (Kwon et al. 2023, "Efficient Memory Management for Large
Language Model Serving with PagedAttention"): memory for the KV cache is cut into `num_pages`
fixed-size pages of `page_size` tokens, named by integer ids 0, 1, ...; each sequence owns a
*block table*, the list of its page ids in token order, which grows a page at a time as
tokens are appended.
Nothing is reserved for a sequence's maximum length, so the batch is limited by the tokens
actually held, not by the longest possible request.

How the engine (engine.py) maps ids to memory: per layer, one preallocated array per cache
leaf with a row per page id:

    full attention   k, v: [num_pages, page_size, ...]   token t of a sequence with table bt
    MLA              latent, rope key: the same          lives at row bt[t // page_size],
                                                         offset t % page_size
    state layers     [num_pages, ...state]               a *slot* is `slot_pages` pages; the
    (window rings,                                       state lives in the row of its first
     linear states)                                      page

so one budget of num_pages pages pays for both per-token KV and per-sequence state, and a
hybrid model allocates both from it. (With per-layer arrays, a page id used for KV leaves that
row unused in the state layers and vice versa; vLLM's hybrid allocator groups layers to avoid
that waste. This module only counts pages and does not care which layout the engine picks.)

Each page is in exactly one of three states, checked by `check()`:

    free     on the free list, ref == 0
    used     ref > 0: held by one or more block tables or slots (a shared prefix has ref > 1)
    cached   ref == 0 but kept by a prefix index (radix.py), reusable until evicted

Errors: `ValueError` for input that can never work (zero pages, a sequence longer than the
pool, a double free); `OutOfPages` (a RuntimeError) for a shortage that eviction or
preemption can cure - the scheduler catches it, nothing else should.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable


class OutOfPages(RuntimeError):
    """Not enough free pages right now; `needed` and `free` say by how much."""

    def __init__(self, needed: int, free: int):
        super().__init__(f"need {needed} free pages, have {free}")
        self.needed, self.free = needed, free


def integer(name: str, value, minimum: int | None = 1) -> int:
    """`value` as an int, or a ValueError naming the field, the value and what is allowed: a
    whole number (Python's or numpy's; not a bool, a float or a string) >= `minimum`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        bound = f" >= {minimum}" if minimum is not None else ""
        raise ValueError(f"{name}={value!r} ({type(value).__name__}): must be an integer{bound}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name}={value!r}: must be an integer >= {minimum}")
    return int(value)


def pages_for(tokens: int, page_size: int) -> int:
    """Pages that hold `tokens` tokens: ceil(tokens / page_size)."""
    return -(-tokens // page_size)


class PagePool:
    """`num_pages` pages of `page_size` tokens: a free list, reference counts, block tables."""

    def __init__(self, num_pages: int, page_size: int, slot_pages: int = 1):
        num_pages, page_size, slot_pages = (integer(name, value) for name, value in
                                            [("num_pages", num_pages), ("page_size", page_size),
                                             ("slot_pages", slot_pages)])
        self.num_pages, self.page_size, self.slot_pages = num_pages, page_size, slot_pages
        self.ref = [0] * num_pages
        self.cached: set[int] = set()
        self._free = list(range(num_pages - 1, -1, -1))  # a stack: page 0 is handed out first
        self._tables: dict[int, list[int]] = {}  # sequence id -> page ids in token order
        self._lengths: dict[int, int] = {}  # sequence id -> tokens held
        self._slots: dict[int, list[list[int]]] = {}  # sequence id -> its slots' pages

    # ---- counts -------------------------------------------------------------------------
    @property
    def free_pages(self) -> int:
        return len(self._free)

    @property
    def used_pages(self) -> int:
        """Pages with a reference: free, used and cached partition the pages (`check`), so
        this is what is neither free nor cached, without a scan of every page."""
        return self.num_pages - len(self._free) - self.cached_pages

    @property
    def cached_pages(self) -> int:
        return sum(self.ref[p] == 0 for p in self.cached)

    def capacity_check(self, tokens: int, slots: int = 0, name: str = "sequence") -> None:
        """Raise ValueError if `tokens` tokens plus `slots` slots exceed the whole pool."""
        need = pages_for(tokens, self.page_size) + slots * self.slot_pages
        if need > self.num_pages:
            raise ValueError(
                f"{name} of {tokens} tokens and {slots} slots needs {need} pages of "
                f"{self.page_size} tokens; the pool has only {self.num_pages}: enlarge the "
                "pool or shorten the request")

    # ---- pages --------------------------------------------------------------------------
    def alloc(self, n: int) -> list[int]:
        """Take `n` pages off the free list with ref = 1, all or none."""
        if n > len(self._free):
            raise OutOfPages(n, len(self._free))
        pages = [self._free.pop() for _ in range(n)]
        for p in pages:
            self.ref[p] = 1
        return pages

    def incref(self, pages: Iterable[int]) -> None:
        """One more holder for each page (a cached page becomes used again)."""
        for p in pages:
            if self.ref[p] == 0 and p not in self.cached:
                raise ValueError(f"page {p} is free: only a used or cached page can be shared")
            self.ref[p] += 1

    def decref(self, pages: Iterable[int]) -> None:
        """One holder fewer; a page nobody holds goes back to the free list unless cached."""
        for p in pages:
            if self.ref[p] == 0:
                raise ValueError(f"double free of page {p}: its reference count is already 0")
            self.ref[p] -= 1
            if self.ref[p] == 0 and p not in self.cached:
                self._free.append(p)

    def mark_cached(self, pages: Iterable[int]) -> None:
        """A prefix index keeps these (still used) pages when their holders let go."""
        for p in pages:
            if self.ref[p] == 0:
                raise ValueError(f"page {p} is not in use: only a used page can be cached")
            self.cached.add(p)

    def uncache(self, pages: Iterable[int]) -> None:
        """The index evicts these pages: back to the free list (none may be in use)."""
        for p in pages:
            if p not in self.cached or self.ref[p] != 0:
                raise ValueError(f"page {p} cannot be evicted: cached={p in self.cached}, "
                                 f"ref={self.ref[p]}")
            self.cached.remove(p)
            self._free.append(p)

    # ---- sequences ----------------------------------------------------------------------
    def open(self, seq: int, shared: Iterable[int] = (), slots: int = 0) -> None:
        """Start `seq`'s block table with `shared` (whole, cached-prefix) pages and `slots`
        fixed-size state slots of `slot_pages` pages each."""
        if seq in self._tables:
            raise ValueError(f"sequence {seq} is already open")
        shared = list(shared)
        for p in shared:
            if self.ref[p] == 0 and p not in self.cached:
                raise ValueError(f"page {p} is free: only a used or cached page can be shared")
        state = self.alloc(slots * self.slot_pages)  # may raise OutOfPages: nothing changed yet
        self.incref(shared)
        self._tables[seq], self._lengths[seq] = shared, len(shared) * self.page_size
        k = self.slot_pages
        self._slots[seq] = [state[i * k:(i + 1) * k] for i in range(slots)]

    def pages_needed(self, seq: int, n: int) -> int:
        """New pages `append(seq, n)` would take."""
        have = len(self._tables[seq])
        return pages_for(self._lengths[seq] + n, self.page_size) - have

    def append(self, seq: int, n: int) -> list[int]:
        """Make room for `n` more tokens of `seq`; returns the new pages (all or none)."""
        self.capacity_check(self._lengths[seq] + n, len(self._slots[seq]), f"sequence {seq}")
        new = self.alloc(self.pages_needed(seq, n))
        self._tables[seq].extend(new)
        self._lengths[seq] += n
        return new

    def share_prefix(self, seq: int, pages: Iterable[int]) -> None:
        """Make `pages` the first entries of `seq`'s block table: where the prefix index
        already held the same tokens in another page, `seq` switches to that page and its
        own copy loses a holder (and is freed), so identical prefixes end up in one page."""
        table = self._tables[seq]
        for i, p in enumerate(pages):
            if table[i] != p:
                self.incref([p])
                self.decref([table[i]])
                table[i] = p

    def close(self, seq: int) -> None:
        """Drop `seq`: each of its pages and slots loses one holder."""
        if seq not in self._tables:
            raise ValueError(f"sequence {seq} is not open (closed twice?)")
        self.decref(self._tables.pop(seq))
        for slot in self._slots.pop(seq):
            self.decref(slot)
        del self._lengths[seq]

    def block_table(self, seq: int) -> list[int]:
        return list(self._tables[seq])

    def length(self, seq: int) -> int:
        return self._lengths[seq]

    def slot_table(self, seq: int) -> list[list[int]]:
        return [list(s) for s in self._slots[seq]]

    @property
    def sequences(self) -> list[int]:
        return list(self._tables)

    def check(self) -> dict[str, int]:
        """Assert the invariant (free, used and cached partition the pages; no page has fewer
        references than block tables and slots holding it) and return the three counts."""
        held = [0] * self.num_pages
        for seq, table in self._tables.items():
            assert len(table) == pages_for(self._lengths[seq], self.page_size), seq
            for p in table + [p for s in self._slots[seq] for p in s]:
                held[p] += 1
        free = set(self._free)
        assert len(free) == len(self._free), "a page is on the free list twice"
        for p in range(self.num_pages):
            assert held[p] <= self.ref[p], f"page {p}: {held[p]} holders > ref {self.ref[p]}"
            states = (p in free) + (self.ref[p] > 0) + (self.ref[p] == 0 and p in self.cached)
            assert states == 1, f"page {p}: ref={self.ref[p]} free={p in free} " \
                                f"cached={p in self.cached}"
        assert self.used_pages == sum(r > 0 for r in self.ref)
        return {"free": self.free_pages, "used": self.used_pages, "cached": self.cached_pages}
