"""Radix prefix cache over token ids at page granularity, with LRU eviction of unreferenced leaves.

Ownership is expressed with the allocator's refcounts, never with a parallel lock count:
- the cache holds exactly one reference on every page in the tree;
- a request that shares cached pages holds one more reference on each (the scheduler increfs
  `MatchResult.pages` when it admits the request);
- a leaf is evictable iff each of its pages has refcount 1 (only the cache holds it).

NOTE: requests share whole matched prefixes (root .. `MatchResult.node`), so the set of
referenced nodes is closed under "parent of": an unreferenced node never has a referenced
descendant, and evicting leaves repeatedly can free every unreferenced cached page.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import NamedTuple

from .memory import PageAllocator


class _Node:
    """An edge of the tree together with the node it leads to: `key` holds whole pages of
    tokens (`len(key) == len(pages) * page_size`); children are keyed by their first page."""

    __slots__ = ("key", "pages", "children", "parent", "last_access", "uid")
    _uids = itertools.count()

    def __init__(self, key: tuple[int, ...], pages: list[int], parent: _Node | None) -> None:
        self.key = key
        self.pages = pages
        self.children: dict[tuple[int, ...], _Node] = {}
        self.parent = parent
        self.last_access = 0
        self.uid = next(self._uids)


class MatchResult(NamedTuple):
    pages: list[int]  # cached pages of the prefix, in order; NOT increfed for the caller
    num_tokens: int  # == len(pages) * page_size
    node: _Node  # deepest matched node (the root when nothing matched)
    # Of `num_tokens`, the trailing ones this match brought back from a host tier (HiCache);
    # the rest were on the device already.
    num_loaded_tokens: int = 0


class InsertResult(NamedTuple):
    num_cached_tokens: int  # tokens of the inserted prefix that were already cached
    num_new_pages: int  # pages the cache took over from the caller
    node: _Node  # node holding the last inserted page (the root when nothing was inserted)


class RadixCache:
    """Page-granular prefix cache. Not thread-safe: the engine loop thread owns it.

    Subclasses (hiradix_cache.py) extend nodes through `node_type` and hook into matching,
    insertion and integrity checks; a node's size is its key's, so it may hold no device page.
    """

    node_type: type[_Node] = _Node

    def __init__(self, page_size: int, allocator: PageAllocator) -> None:
        assert page_size >= 1
        self.page_size = page_size
        self.allocator = allocator
        self.root = self.node_type((), [], None)
        self._num_pages = 0
        self._tick = 0
        # Tokens whose pages eviction took off the device (SGLang's sglang:evicted_tokens_total);
        # a flush (`reset`) is not eviction and is not counted.
        self.num_evicted_tokens = 0

    @property
    def num_cached_pages(self) -> int:
        return self._num_pages

    def _page(self, tokens: list[int] | tuple[int, ...], i: int) -> tuple[int, ...]:
        p = self.page_size
        return tuple(tokens[i * p : (i + 1) * p])

    def _size(self, node: _Node) -> int:
        """Pages of tokens on the node's edge."""
        return len(node.key) // self.page_size

    def _common_pages(self, node: _Node, tokens: list[int], start: int, limit: int) -> int:
        """Number of leading pages of `node.key` equal to token pages `start ..` (at most
        `limit` pages)."""
        n = min(self._size(node), limit)
        for j in range(n):
            if self._page(node.key, j) != self._page(tokens, start + j):
                return j
        return n

    def _split(self, node: _Node, m: int) -> _Node:
        """Split `node` after its first `m` pages (0 < m < its size); returns the upper half.
        Pages and refcounts are unchanged: a split only re-labels tree structure."""
        assert 0 < m < self._size(node) and node.parent is not None
        cut = m * self.page_size
        upper = self.node_type(node.key[:cut], node.pages[:m], node.parent)
        upper.last_access = node.last_access
        node.parent.children[self._page(upper.key, 0)] = upper
        node.key, node.pages, node.parent = node.key[cut:], node.pages[m:], upper
        upper.children[self._page(node.key, 0)] = node
        return upper

    def match_prefix(self, tokens: list[int], max_tokens: int | None = None) -> MatchResult:
        """Longest cached page-aligned prefix of `tokens`, at most `max_tokens` tokens.

        Mutates: touches the matched path (LRU) and may split a node so that the match ends on
        a node boundary. Does not change refcounts: a caller that keeps the pages must
        `allocator.incref(result.pages)` before anything can evict them.
        """
        return self._result(self._match_path(tokens, max_tokens))

    def _match_path(self, tokens: list[int], max_tokens: int | None) -> list[_Node]:
        """The nodes (root excluded) of the longest page-aligned prefix of `tokens` in the
        tree, at most `max_tokens` tokens; touched (LRU), the last one split to end there."""
        limit = len(tokens) if max_tokens is None else max(0, min(len(tokens), max_tokens))
        n = limit // self.page_size
        self._tick += 1
        node, path, i = self.root, [], 0
        while i < n:
            child = node.children.get(self._page(tokens, i))
            if child is None:
                break
            m = self._common_pages(child, tokens, i, n - i)
            if m < self._size(child):
                child = self._split(child, m)
            child.last_access = self._tick
            path.append(child)
            i += m
            node = child
        return path

    def _result(self, path: list[_Node], num_loaded_tokens: int = 0) -> MatchResult:
        pages = [p for node in path for p in node.pages]
        assert len(pages) == sum(self._size(node) for node in path), "matched a node without pages"
        return MatchResult(pages, len(pages) * self.page_size, path[-1] if path else self.root, num_loaded_tokens)

    def insert(self, tokens: list[int], pages: list[int]) -> InsertResult:
        """Insert the full pages of a sequence: `pages[i]` holds tokens `i*P .. i*P+P-1`.

        Args: `tokens` (a trailing partial page is ignored) and exactly `len(tokens) // P`
        pages, on each of which the caller holds one reference.
        Mutates: consumes every one of the caller's references. Pages new to the tree pass to
        the cache; for prefixes already cached the caller's reference is dropped (its duplicate
        page is freed, or a page it borrowed from the cache goes back to refcount 1).
        """
        n = len(tokens) // self.page_size
        assert len(pages) == n, f"insert of {len(tokens)} tokens needs {n} pages, got {len(pages)}"
        self._tick += 1
        node, i = self.root, 0
        while i < n:
            key = self._page(tokens, i)
            child = node.children.get(key)
            if child is None:
                new = self.node_type(tuple(tokens[i * self.page_size : n * self.page_size]), list(pages[i:]), node)
                new.last_access = self._tick
                node.children[key] = new
                self._num_pages += n - i
                return InsertResult(i * self.page_size, n - i, new)
            m = self._common_pages(child, tokens, i, n - i)
            if m < self._size(child):
                child = self._split(child, m)
            self._absorb(child, pages[i : i + m])
            child.last_access = self._tick
            i += m
            node = child
        return InsertResult(n * self.page_size, 0, node)

    def _absorb(self, node: _Node, pages: list[int]) -> None:
        """An insert brought `pages` (one caller reference each) for tokens `node` already
        caches: the node keeps its own pages and the caller's references are dropped."""
        self.allocator.decref(pages)

    def _evictable(self, node: _Node) -> bool:
        return node is not self.root and not node.children and all(self.allocator.refcount(p) == 1 for p in node.pages)

    def _nodes(self) -> list[_Node]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def evict(self, num_pages: int) -> int:
        """Free at least `num_pages` pages if possible by removing unreferenced leaves, least
        recently used first (a parent left childless becomes a candidate). Whole nodes are
        removed, so more than `num_pages` may be freed. Returns the number of pages freed."""
        freed = self._evict_lru(num_pages, self._evictable, self._remove_leaf)
        self.num_evicted_tokens += freed * self.page_size
        return freed

    def _remove_leaf(self, leaf: _Node) -> int:
        parent = leaf.parent
        assert parent is not None
        del parent.children[self._page(leaf.key, 0)]
        released = self.allocator.decref(leaf.pages)
        assert len(released) == len(leaf.pages), "evicted a page someone still holds"
        self._num_pages -= len(released)
        return len(released)

    def _evict_lru(self, want: int, evictable: Callable[[_Node], bool], drop: Callable[[_Node], int]) -> int:
        """Drop nodes that `evictable` allows, least recently used first, until `drop` (which
        returns what one node freed) has freed at least `want`; a parent that becomes evictable
        joins the candidates. The device pool and the host tier evict through this one loop."""
        if want <= 0:
            return 0
        heap = [(n.last_access, n.uid, n) for n in self._nodes() if evictable(n)]
        heapq.heapify(heap)
        freed = 0
        while heap and freed < want:
            _, _, node = heapq.heappop(heap)
            if not evictable(node):
                continue
            parent = node.parent
            freed += drop(node)
            if parent is not None and evictable(parent):
                heapq.heappush(heap, (parent.last_access, parent.uid, parent))
        return freed

    def evictable_pages(self) -> int:
        """Cached pages no request holds (what `reset()` or a large enough `evict` frees)."""
        return sum(1 for n in self._nodes() for p in n.pages if self.allocator.refcount(p) == 1)

    def reset(self) -> int:
        """Drop every cached page no request holds (/flush_cache). Returns pages freed."""
        return self._evict_lru(self._num_pages, self._evictable, self._remove_leaf)

    def all_pages(self) -> list[int]:
        """Every page the tree holds a reference on."""
        return [p for n in self._nodes() for p in n.pages]

    def check_integrity(self) -> None:
        """Assert tree shape, page-size alignment, child keys, page uniqueness and that every
        cached page has a live reference."""
        seen: set[int] = set()
        count = 0
        for node in self._nodes():
            for key, child in node.children.items():
                assert child.parent is node, "broken parent link"
                assert len(child.key) >= self.page_size, "empty non-root node"
                assert len(child.key) % self.page_size == 0, "key not whole pages"
                assert key == self._page(child.key, 0), "child keyed by the wrong page"
                self._check_node(child)
            for p in node.pages:
                assert p not in seen, f"page {p} cached twice"
                assert self.allocator.refcount(p) >= 1, f"cached page {p} is free"
                seen.add(p)
            count += len(node.pages)
        assert not self.root.pages and self.root.parent is None
        assert count == self._num_pages, f"counted {count} cached pages, tracked {self._num_pages}"

    def _check_node(self, node: _Node) -> None:
        """Per-node invariants of check_integrity: here, a device page for every key page."""
        assert len(node.pages) == self._size(node), "key/pages mismatch"
