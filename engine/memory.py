"""Page ids for every KV pool at once, refcounted. Pure bookkeeping: no tensors live here.

A page id indexes the window-KV, compressed-KV and index-K pools together (STRUCTURE.md,
"Memory layout"), so one allocator serves them all. Holders of a page (requests, radix cache
nodes) each own one reference; a page is free exactly when its refcount is 0.
"""

from __future__ import annotations

from collections.abc import Iterable


class PageAllocator:
    """Refcounted page ids `0 .. num_pages - 1`.

    Invariants (asserted, see `check_integrity`): a page is on the free list iff its refcount
    is 0; the free list holds no duplicates; `num_free + num_used == num_pages`.
    """

    def __init__(self, num_pages: int) -> None:
        assert num_pages >= 1, "the pool needs at least one page"
        self.num_pages = num_pages
        # NOTE: a stack popped from the end; reversed so a fresh pool hands out 0, 1, 2, ...
        # (deterministic page ids make tests and traces readable).
        self._free: list[int] = list(range(num_pages - 1, -1, -1))
        self._ref: list[int] = [0] * num_pages
        self._num_shared = 0  # pages with refcount >= 2

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_pages - len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of pages with a nonzero refcount, in [0, 1]."""
        return self.num_used / self.num_pages

    @property
    def num_shared(self) -> int:
        """Pages with more than one holder (with the radix cache: cached pages a request uses)."""
        return self._num_shared

    def refcount(self, page: int) -> int:
        return self._ref[page]

    def can_alloc(self, n: int) -> bool:
        return 0 <= n <= len(self._free)

    def alloc(self, n: int) -> list[int]:
        """Take `n` free pages, each with refcount 1 owned by the caller.

        Asserts `can_alloc(n)`. Mutates the free list and refcounts.
        """
        assert self.can_alloc(n), f"alloc({n}) with {len(self._free)} free pages"
        if n == 0:
            return []
        pages = self._free[-n:]
        del self._free[-n:]
        pages.reverse()
        for p in pages:
            assert self._ref[p] == 0, f"page {p} on the free list with refcount {self._ref[p]}"
            self._ref[p] = 1
        return pages

    def incref(self, pages: Iterable[int]) -> None:
        """Add one reference to each page. Every page must already be in use (refcount >= 1):
        a new holder can only share a page someone else holds, never revive a free one."""
        for p in pages:
            assert self._ref[p] >= 1, f"incref of free page {p}"
            self._ref[p] += 1
            self._num_shared += self._ref[p] == 2

    def decref(self, pages: Iterable[int]) -> list[int]:
        """Drop one reference from each page; pages whose count reaches 0 return to the free
        list. Returns those freed pages (in argument order). Asserts on a double free."""
        freed: list[int] = []
        for p in pages:
            assert self._ref[p] >= 1, f"double free of page {p}"
            self._ref[p] -= 1
            self._num_shared -= self._ref[p] == 1
            if self._ref[p] == 0:
                self._free.append(p)
                freed.append(p)
        return freed

    def check_integrity(self) -> None:
        """Assert the free list and refcounts agree."""
        free = set(self._free)
        assert len(free) == len(self._free), "duplicate page on the free list"
        for p, r in enumerate(self._ref):
            assert r >= 0, f"page {p} has negative refcount {r}"
            assert (r == 0) == (p in free), f"page {p}: refcount {r}, on free list: {p in free}"
        assert self._num_shared == sum(r >= 2 for r in self._ref), "shared-page count drifted"

    def __repr__(self) -> str:
        return f"PageAllocator(num_pages={self.num_pages}, free={self.num_free})"
