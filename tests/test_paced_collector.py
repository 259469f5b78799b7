"""The collector during the load (paced_collector.py): young cycles freed on its clock, frozen
ones at the amnesty, and the collector as it was afterwards."""

from __future__ import annotations

import gc
import mmap
import weakref

import anyio

from dsv4bench.loop.paced_collector import paced_collection, rss_bytes

try:  # a builtin from Python 3.11; anyio brings the backport before it
    BaseExceptionGroup
except NameError:  # pragma: no cover - Python 3.10
    from exceptiongroup import BaseExceptionGroup


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only a collection frees it


def _dropped_cycle() -> weakref.ref[Node]:
    return weakref.ref(Node())


def test_a_young_cycle_is_freed_on_the_clock_with_automatic_collection_off():
    async def main() -> None:
        async with anyio.create_task_group() as tg:
            with paced_collection(tg, period_s=0.01):
                assert not gc.isenabled()
                gone = _dropped_cycle()
                assert gone() is not None  # no collection has run since: the cycle is still there
                with anyio.fail_after(2):
                    while gone() is not None:
                        await anyio.sleep(0.01)

    anyio.run(main)
    assert gc.isenabled() and gc.get_freeze_count() == 0  # as it was


def test_a_cycle_dropped_after_it_was_frozen_waits_for_the_memory_to_grow():
    memory = [1000]

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            with paced_collection(tg, period_s=0.01, check_s=0, min_growth=100, weigh=lambda: memory[0]):
                kept = Node()
                await anyio.sleep(0.05)  # it survived a collection: frozen
                gone = weakref.ref(kept)
                del kept
                memory[0] = 2000  # grown, but not more than doubled
                await anyio.sleep(0.1)
                assert gone() is not None  # young collections do not walk the frozen heap
                memory[0] = 2001
                with anyio.fail_after(2):
                    while gone() is not None:
                        await anyio.sleep(0.01)

    anyio.run(main)
    assert gc.get_freeze_count() == 0


def test_the_memory_weighed_is_this_processs_own():
    # Fresh pages of its own mapping: a bytearray may reuse memory freed earlier in the process,
    # already resident (CI's long test run), and then the memory does not grow.
    size = 64 * 1024 * 1024
    before = rss_bytes()
    with mmap.mmap(-1, size) as block:
        for offset in range(0, size, mmap.PAGESIZE):
            block[offset] = 1  # touched: resident
        assert before > 0 and rss_bytes() >= before + 48 * 1024 * 1024


def test_the_collector_is_restored_when_the_load_fails():
    gc.disable()
    try:

        async def main() -> None:
            async with anyio.create_task_group() as tg:
                with paced_collection(tg):
                    raise ValueError("the load failed")

        try:
            anyio.run(main)
        except BaseExceptionGroup as group:  # the caller's task group wraps it, as any task group does
            assert group.subgroup(ValueError) is not None
        else:
            raise AssertionError("the load's error was lost")
        assert not gc.isenabled() and gc.get_freeze_count() == 0  # disabled before: disabled after
    finally:
        gc.enable()


def test_the_amnesty_allowance_is_half_the_available_memory_and_never_under_the_floor():
    from dsv4bench.loop.paced_collector import AMNESTY_MIN_BYTES, available_bytes, growth_allowance

    gib = 1024**3
    assert growth_allowance(20 * gib) == 10 * gib  # a 24 GiB machine: no pause before 10 GiB more
    assert growth_allowance(gib) == AMNESTY_MIN_BYTES  # a small machine keeps the floor
    assert growth_allowance(0) == AMNESTY_MIN_BYTES  # a machine that does not say
    assert available_bytes() >= 0
