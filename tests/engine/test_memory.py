"""PageAllocator: allocation order, refcounts, double-free detection, random invariants."""

from __future__ import annotations

import random

import pytest

from dsv4bench.engine.memory import PageAllocator


def test_fresh_pool_hands_out_pages_in_order() -> None:
    a = PageAllocator(8)
    assert (a.num_free, a.num_used, a.usage) == (8, 0, 0.0)
    assert a.alloc(3) == [0, 1, 2]
    assert a.alloc(0) == []
    assert (a.num_free, a.num_used, a.usage) == (5, 3, 3 / 8)
    assert all(a.refcount(p) == 1 for p in (0, 1, 2))
    a.check_integrity()


def test_alloc_beyond_free_asserts() -> None:
    a = PageAllocator(4)
    assert a.can_alloc(4) and not a.can_alloc(5) and not a.can_alloc(-1)
    a.alloc(4)
    assert not a.can_alloc(1)
    with pytest.raises(AssertionError):
        a.alloc(1)


def test_refcount_frees_only_at_zero() -> None:
    a = PageAllocator(4)
    pages = a.alloc(2)
    a.incref(pages)
    assert a.num_shared == 2
    assert a.decref(pages) == []
    assert a.num_shared == 0
    assert a.num_free == 2
    assert a.decref([pages[1], pages[0]]) == [pages[1], pages[0]]
    assert a.num_free == 4 and a.usage == 0.0
    a.check_integrity()


def test_double_free_and_incref_of_free_page_assert() -> None:
    a = PageAllocator(4)
    (p,) = a.alloc(1)
    a.decref([p])
    with pytest.raises(AssertionError):
        a.decref([p])
    with pytest.raises(AssertionError):
        a.incref([p])


def test_freed_pages_are_reused() -> None:
    a = PageAllocator(3)
    pages = a.alloc(3)
    a.decref([pages[1]])
    assert a.alloc(1) == [pages[1]]


@pytest.mark.parametrize("seed", range(5))
def test_random_operations_keep_invariants(seed: int) -> None:
    rng = random.Random(seed)
    a = PageAllocator(32)
    held: list[int] = []  # one entry per reference we own
    for _ in range(500):
        op = rng.random()
        if op < 0.4:
            n = rng.randint(0, 6)
            if a.can_alloc(n):
                held += a.alloc(n)
            else:
                assert n > a.num_free
        elif op < 0.6 and held:
            p = rng.choice(held)
            a.incref([p])
            held.append(p)
        elif held:
            p = held.pop(rng.randrange(len(held)))
            freed = a.decref([p])
            assert freed == ([] if p in held else [p])
        a.check_integrity()
        for p in range(32):
            assert a.refcount(p) == held.count(p)
        assert a.num_free == 32 - len(set(held))
        assert a.num_shared == sum(held.count(p) >= 2 for p in set(held))
