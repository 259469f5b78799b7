"""HiCache's control plane: a radix cache whose evicted pages move to a host tier instead of
being dropped, and come back when a later request matches them (SGLang's HiRadixCache, with
write-back on eviction). Torch-free: page contents move through a `PageMover`
(engine/host_tier.py on the real engine, a dict in tests).

A node's pages live on the device (`pages`: ids in the KV pools, one cache reference each, as
in RadixCache), on the host (`host`: slot ids of the host tier, one reference each in
`host_slots`), or on both. Invariants (check_integrity):
- every node has all its pages on the device, on the host, or on both;
- a node without device pages has no descendant with device pages: a match is a device prefix
  followed by host-only nodes, and the device-resident nodes stay closed under "parent of";
- a node whose load is in flight (`load` not done) keeps its device pages and its host copy
  (the loader is writing the one from the other).

Eviction moves an unreferenced device leaf's pages to the host (a copy, unless the node still
has one from before) and keeps the node in the tree; when the host tier is full, its least
recently used copies go first (a host-only leaf leaves the tree with its copy).

A match that reaches host-only nodes loads them back (match_prefix): device pages are taken for
them (evicting other leaves, never the matched prefix), one load batch is started, and the
pages are returned at once with the rest of the match. The request's prefill runs in the same
step while the loader copies layer by layer; every reader waits at the pools' per-layer gate.
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple, Protocol

from .memory import PageAllocator
from .radix_cache import MatchResult, RadixCache, _Node


class LoadHandle(Protocol):
    def done(self) -> bool:
        """Whether every layer of the load has landed in the device pools."""
        ...


class PageMover(Protocol):
    """The host tier's data plane, as the cache sees it."""

    num_slots: int  # host capacity in pages
    bytes_loaded: int  # bytes landed in the device pools so far
    unguarded_reads: int  # index-K reads that went ahead of a load (the planted fault's window)

    def backup(self, device_pages: list[int], host_slots: list[int]) -> None:
        """Copy device pages into host slots; complete when it returns."""
        ...

    def load(self, host_slots: list[int], device_pages: list[int]) -> LoadHandle:
        """Start copying host slots onto device pages (layer by layer); returns at once.
        Readers of the device pools are held back per layer until their layer has landed."""
        ...

    def wait_all(self) -> None:
        """Block until no load is in flight."""
        ...


class HiCacheStats(NamedTuple):
    host_pages_used: int
    host_pages_total: int
    loads_total: int  # load batches started
    pages_loaded_total: int
    pages_backed_up_total: int
    load_bytes_total: int
    unguarded_index_k_reads_total: int
    page_size: int  # tokens per page, for the token counts SGLang exports

    @property
    def host_used_tokens(self) -> int:
        return self.host_pages_used * self.page_size

    @property
    def host_total_tokens(self) -> int:
        return self.host_pages_total * self.page_size

    @property
    def load_back_tokens_total(self) -> int:
        return self.pages_loaded_total * self.page_size


class _HiNode(_Node):
    __slots__ = ("host", "load")

    def __init__(self, key: tuple[int, ...], pages: list[int], parent: _Node | None) -> None:
        super().__init__(key, pages, parent)
        self.host: list[int] = []  # host slots holding a copy of this node's pages
        self.load: LoadHandle | None = None  # the load filling `pages`, until seen done


class HiRadixCache(RadixCache):
    """RadixCache with a host tier. Not thread-safe: the engine loop thread owns it."""

    node_type = _HiNode

    def __init__(self, page_size: int, allocator: PageAllocator, mover: PageMover) -> None:
        super().__init__(page_size, allocator)
        self.mover = mover
        self.host_slots = PageAllocator(mover.num_slots)
        self.num_loads = 0  # load batches started
        self.num_pages_loaded = 0
        self.num_pages_backed_up = 0

    @property
    def num_host_pages(self) -> int:
        """Host slots in use (copies of cached pages)."""
        return self.host_slots.num_used

    def stats(self) -> HiCacheStats:
        return HiCacheStats(
            self.host_slots.num_used,
            self.host_slots.num_pages,
            self.num_loads,
            self.num_pages_loaded,
            self.num_pages_backed_up,
            self.mover.bytes_loaded,
            self.mover.unguarded_reads,
            self.page_size,
        )

    def _loading(self, node: _HiNode) -> bool:
        if node.load is not None and node.load.done():
            node.load = None
        return node.load is not None

    def _split(self, node: _Node, m: int) -> _Node:
        assert isinstance(node, _HiNode)
        upper = super()._split(node, m)
        assert isinstance(upper, _HiNode)
        upper.host, node.host = node.host[:m], node.host[m:]
        upper.load = node.load
        return upper

    # ---- match: device prefix, then load host-only nodes back ---------------------------

    def match_prefix(self, tokens: list[int], max_tokens: int | None = None) -> MatchResult:
        """RadixCache.match_prefix, where host-only nodes of the match get device pages and
        start loading back (as many as the device pool can take).

        Mutates: besides the LRU touch and split, may evict other device leaves to the host
        and host copies to nothing, allocates device pages to the loaded nodes (the cache
        holds them) and starts one load. Refcounts for the caller as in RadixCache.
        """
        path = self._match_path(tokens, max_tokens)
        cold = next((i for i, n in enumerate(path) if not n.pages), len(path))
        if cold == len(path):
            return self._result(path)
        loaded = self._load_back(path[:cold], path[cold:])
        return self._result(path[:cold] + loaded, sum(self._size(n) for n in loaded) * self.page_size)

    def _load_back(self, warm: list[_Node], cold: list[_Node]) -> list[_Node]:
        """Give the host-only nodes `cold` (the path continuing `warm`) device pages and start
        loading them; returns the leading part of `cold` that fitted."""
        held = [p for n in warm for p in n.pages]
        host = [s for n in cold for s in self._hi(n).host]
        # NOTE: pinned while we make room: our own eviction must not take the matched prefix
        # off the device, nor drop the host copies we are about to load.
        self.allocator.incref(held)
        self.host_slots.incref(host)
        loaded: list[_Node] = []
        try:
            need = sum(self._size(n) for n in cold)
            if not self.allocator.can_alloc(need):
                self.evict(need - self.allocator.num_free)
            fit, total = 0, 0
            while fit < len(cold) and total + self._size(cold[fit]) <= self.allocator.num_free:
                total += self._size(cold[fit])
                fit += 1
            loaded = cold[:fit]
            if loaded:
                pages = self.allocator.alloc(total)
                slots: list[int] = []
                i = 0
                for node in loaded:
                    n = self._size(node)
                    node.pages = pages[i : i + n]
                    slots += self._hi(node).host
                    i += n
                handle = self.mover.load(slots, pages)
                for node in loaded:
                    self._hi(node).load = handle
                self._num_pages += total
                self.num_loads += 1
                self.num_pages_loaded += total
        finally:
            self.allocator.decref(held)
            self.host_slots.decref(host)
        return loaded

    # ---- insert: a host-only node takes the caller's fresh pages as its device copy -----

    def _absorb(self, node: _Node, pages: list[int]) -> None:
        if node.pages:
            super()._absorb(node, pages)
            return
        # NOTE: the caller computed these tokens itself (had it shared this node's pages, the
        # node could not have left the device), so its pages become the node's device copy.
        node.pages = list(pages)
        self._num_pages += len(pages)

    # ---- eviction: device -> host -> gone ------------------------------------------------

    def _evictable(self, node: _Node) -> bool:
        """A device leaf (no child on the device) that only the cache holds, not loading."""
        return (
            node is not self.root
            and bool(node.pages)
            and not any(c.pages for c in node.children.values())
            and all(self.allocator.refcount(p) == 1 for p in node.pages)
            and not self._loading(self._hi(node))
        )

    def evict(self, num_pages: int) -> int:
        """Free at least `num_pages` device pages if possible: unreferenced device leaves,
        least recently used first, move to the host tier and stay in the tree (host-only); a
        parent left without device children becomes a candidate. Returns device pages freed."""
        freed = self._evict_lru(num_pages, self._evictable, lambda node: self._demote(self._hi(node)))
        # NOTE: counted whether the pages went to the host or, with the host full, nowhere:
        # either way they left the device pool (SGLang's evicted_tokens_total).
        self.num_evicted_tokens += freed * self.page_size
        return freed

    def _demote(self, node: _HiNode) -> int:
        """Move an evictable node's pages off the device (to the host, or nowhere when the host
        has no room); returns the device pages freed."""
        n = len(node.pages)
        if not node.host:
            slots = self._take_host_slots(n)
            if slots is None:
                self._discard(node)
                return n
            self.mover.backup(node.pages, slots)
            node.host = slots
            self.num_pages_backed_up += n
        released = self.allocator.decref(node.pages)
        assert len(released) == n, "evicted a page someone still holds"
        node.pages = []
        self._num_pages -= n
        return n

    def _take_host_slots(self, n: int) -> list[int] | None:
        if not self.host_slots.can_alloc(n):
            # NOTE: a full host frees a batch (1/16 of its capacity) at a time, so that a run
            # of backups scans the tree for host victims once, not once per node.
            want = max(n - self.host_slots.num_free, self.host_slots.num_pages // 16)
            self._evict_host(want)
        return self.host_slots.alloc(n) if self.host_slots.can_alloc(n) else None

    def _host_evictable(self, node: _Node) -> bool:
        """A host copy nobody pins or reads: of a device-resident node (the copy alone goes),
        or of a host-only leaf (the node goes)."""
        hi = self._hi(node)
        return (
            node is not self.root
            and bool(hi.host)
            and all(self.host_slots.refcount(s) == 1 for s in hi.host)
            and not self._loading(hi)
            and (bool(node.pages) or not node.children)
        )

    def _evict_host(self, num_slots: int) -> int:
        """Free at least `num_slots` host slots if possible, least recently used first.
        Returns the slots freed."""
        return self._evict_lru(num_slots, self._host_evictable, self._drop_host_copy)

    def _drop_host_copy(self, node: _Node) -> int:
        """A device-resident node loses its host copy; a host-only leaf leaves the tree."""
        hi = self._hi(node)
        freed = len(hi.host)
        if node.pages:
            self.host_slots.decref(hi.host)
            hi.host = []
        else:
            self._discard(node)
        return freed

    def _discard(self, node: _Node) -> None:
        """Remove `node` and its subtree from the tree, freeing their device pages and host
        slots. Only the cache may hold them."""
        assert node.parent is not None
        del node.parent.children[self._page(node.key, 0)]
        stack = [node]
        while stack:
            n = self._hi(stack.pop())
            stack.extend(n.children.values())
            released = self.allocator.decref(n.pages)
            assert len(released) == len(n.pages), "discarded a page someone still holds"
            self._num_pages -= len(n.pages)
            self.host_slots.decref(n.host)

    def reset(self) -> int:
        """Drop every cached page no request holds, on both tiers (/flush_cache), after
        waiting for loads in flight. Returns the device pages freed."""
        self.mover.wait_all()
        freed = 0
        for node in reversed(self._nodes()):  # children before their parents
            if node is self.root:
                continue
            hi = self._hi(node)
            hi.load = None
            self.host_slots.decref(hi.host)
            hi.host = []
            if node.children or any(self.allocator.refcount(p) > 1 for p in node.pages):
                continue  # a request still holds it or a descendant: device-resident, kept
            freed += len(node.pages)
            self._discard(node)
        return freed

    # ---- integrity -------------------------------------------------------------------------

    def _check_node(self, node: _Node) -> None:
        hi, size = self._hi(node), self._size(node)
        assert len(node.pages) in (0, size) and len(hi.host) in (0, size), "partial tier copy"
        assert node.pages or hi.host, "node on neither tier"
        if not node.pages:
            assert not any(c.pages for c in node.children.values()), "device page below a host-only node"
            assert hi.load is None, "host-only node loading"

    def check_integrity(self) -> None:
        """RadixCache's checks, plus: every host slot's refcount equals the number of nodes
        holding it."""
        super().check_integrity()
        self.host_slots.check_integrity()
        holders = Counter(s for n in self._nodes() for s in self._hi(n).host)
        for s in range(self.host_slots.num_pages):
            assert self.host_slots.refcount(s) == holders[s], (
                f"host slot {s}: refcount {self.host_slots.refcount(s)}, holders {holders[s]}"
            )

    @staticmethod
    def _hi(node: _Node) -> _HiNode:
        assert isinstance(node, _HiNode)
        return node
