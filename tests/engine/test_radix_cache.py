"""RadixCache: page-aligned matching, dedup on insert, LRU eviction of unreferenced leaves,
reset, and integrity under random operation sequences."""

from __future__ import annotations

import random

import pytest

from dsv4bench.engine.memory import PageAllocator
from dsv4bench.engine.radix_cache import RadixCache

P = 4


def make(num_pages: int = 64) -> tuple[PageAllocator, RadixCache]:
    a = PageAllocator(num_pages)
    return a, RadixCache(P, a)


def put(a: PageAllocator, c: RadixCache, tokens: list[int]) -> list[int]:
    """A 'request' that computed `tokens` in fresh pages and hands its full pages to the cache."""
    pages = a.alloc(len(tokens) // P)
    c.insert(tokens, pages)
    return pages


def test_match_after_insert_is_page_aligned() -> None:
    a, c = make()
    toks = list(range(10))  # 2 full pages + a partial one
    pages = a.alloc(2)
    r = c.insert(toks, pages)
    assert (r.num_cached_tokens, r.num_new_pages) == (0, 2)
    assert c.num_cached_pages == 2 and a.num_free == 62
    m = c.match_prefix(toks)
    assert (m.pages, m.num_tokens) == (pages, 8)
    assert c.match_prefix(toks[:7]).pages == pages[:1]  # the partial second page is ignored
    assert c.match_prefix([0, 1, 2]).num_tokens == 0
    assert c.match_prefix([0, 1, 2, 3, 9, 9, 9, 9]).pages == pages[:1]
    assert c.match_prefix([5, 1, 2, 3]).pages == []
    c.check_integrity()


def test_match_respects_max_tokens_and_splits() -> None:
    a, c = make()
    toks = list(range(16))
    pages = put(a, c, toks)
    assert c.match_prefix(toks, 15).pages == pages[:3]
    assert c.match_prefix(toks, 4).num_tokens == 4
    assert c.match_prefix(toks, 3).num_tokens == 0
    assert c.match_prefix(toks, 0).pages == []
    m = c.match_prefix(toks, 9)
    assert m.pages == pages[:2] and m.node.pages == pages[1:2]  # split at the match boundary
    c.check_integrity()
    assert c.match_prefix(toks).pages == pages


def test_insert_dedups_the_same_prefix_from_two_requests() -> None:
    a, c = make(16)
    first = put(a, c, list(range(12)))
    second = a.alloc(4)
    r = c.insert(list(range(12)) + [50, 51, 52, 53], second)
    assert (r.num_cached_tokens, r.num_new_pages) == (12, 1)
    assert c.num_cached_pages == 4
    assert [a.refcount(p) for p in second[:3]] == [0, 0, 0]  # duplicates freed
    assert a.num_free == 16 - 4
    assert c.match_prefix(list(range(12)) + [50, 51, 52, 53]).pages == first + second[3:]
    c.check_integrity()


def test_insert_of_borrowed_pages_returns_the_borrowed_reference() -> None:
    a, c = make(16)
    cached = put(a, c, list(range(8)))
    m = c.match_prefix(list(range(8)) + [7] * 4, 11)
    a.incref(m.pages)  # the request shares them
    own = a.alloc(1)
    c.insert(list(range(8)) + [7] * 4, m.pages + own)
    assert [a.refcount(p) for p in cached + own] == [1, 1, 1]
    assert c.num_cached_pages == 3 and a.num_free == 13
    c.check_integrity()


def test_evict_is_lru_over_leaves() -> None:
    a, c = make(16)
    pa = put(a, c, [1] * 8)
    pb = put(a, c, [2] * 4)
    pc = put(a, c, [3] * 4)
    c.match_prefix([1] * 8)  # touch A: now B is the least recently used
    assert c.evict(1) == 1
    assert c.match_prefix([2] * 4).pages == [] and a.refcount(pb[0]) == 0
    assert c.evict(1) == 1
    assert c.match_prefix([3] * 4).pages == [] and a.refcount(pc[0]) == 0
    assert c.evict(1) == 2  # whole leaf goes
    assert [a.refcount(p) for p in pa] == [0, 0] and c.num_cached_pages == 0
    assert c.evict(1) == 0
    c.check_integrity()


def test_childless_parent_becomes_evictable() -> None:
    a, c = make(16)
    put(a, c, [1] * 4 + [2] * 4)
    put(a, c, [1] * 4 + [3] * 4)  # splits: [1] -> {[2], [3]}
    assert c.num_cached_pages == 3
    assert c.evict(3) == 3 and a.num_free == 16
    c.check_integrity()


def test_referenced_pages_are_never_evicted() -> None:
    a, c = make(16)
    put(a, c, list(range(12)))
    other = put(a, c, [9] * 8)
    m = c.match_prefix(list(range(12)), 8)
    a.incref(m.pages)
    assert c.evictable_pages() == 3  # third page of the first prefix + the other prefix
    assert c.evict(100) == 3
    assert c.match_prefix(list(range(12))).pages == m.pages
    assert all(a.refcount(p) == 0 for p in other)
    assert c.reset() == 0
    assert c.num_cached_pages == 2
    a.decref(m.pages)
    assert c.reset() == 2 and a.num_free == 16 and c.num_cached_pages == 0
    c.check_integrity()


def test_reset_drops_everything_unreferenced() -> None:
    a, c = make(32)
    for i in range(5):
        put(a, c, [i % 2] * 4 + [i] * 8)
    assert c.num_cached_pages == 2 + 5 * 2
    assert c.reset() == 12 and a.num_free == 32
    assert c.match_prefix([0] * 12).pages == []
    c.check_integrity()


@pytest.mark.parametrize("seed", range(8))
def test_random_operations_keep_integrity(seed: int) -> None:
    """Requests share matched prefixes, write their own pages, insert, and release; the cache
    evicts and resets in between. Checks refcounts = holders, and that matched pages hold
    exactly the tokens they are keyed by."""
    rng = random.Random(seed)
    a, c = make(48)
    content: dict[int, tuple[int, ...]] = {}  # page -> the tokens written into it
    holds: list[tuple[list[int], list[int]]] = []  # (tokens, pages) of live requests

    def seq() -> list[int]:
        return [rng.randrange(2) for _ in range(rng.randint(0, 6) * P + rng.randrange(P))]

    for _ in range(300):
        op = rng.random()
        if op < 0.45:
            toks = seq()
            m = c.match_prefix(toks, rng.randint(0, len(toks)))
            assert m.num_tokens % P == 0 and m.num_tokens == len(m.pages) * P
            for i, p in enumerate(m.pages):
                assert content[p] == tuple(toks[i * P : (i + 1) * P])
            a.incref(m.pages)
            need = len(toks) // P - len(m.pages)
            if not a.can_alloc(need):
                c.evict(need - a.num_free)
            if not a.can_alloc(need):
                a.decref(m.pages)
                continue
            own = a.alloc(need)
            for i, p in enumerate(own, start=len(m.pages)):
                content[p] = tuple(toks[i * P : (i + 1) * P])
            holds.append((toks, m.pages + own))
        elif op < 0.85 and holds:
            toks, pages = holds.pop(rng.randrange(len(holds)))
            if rng.random() < 0.8:
                c.insert(toks, pages)
            else:
                a.decref(pages)
        elif op < 0.95:
            c.evict(rng.randint(0, 8))
        else:
            c.reset()
            assert c.evictable_pages() == 0
        c.check_integrity()
        a.check_integrity()
        cached = set(c.all_pages())
        for p in range(48):
            expected = (p in cached) + sum(pages.count(p) for _, pages in holds)
            assert a.refcount(p) == expected, p
    for _, pages in holds:
        a.decref(pages)
    c.reset()
    assert a.num_free == 48 and c.num_cached_pages == 0
