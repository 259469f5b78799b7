"""The turn lane: one session's work per pass of the loop, with the loop's I/O in between."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from dsv4bench.loop.turn_lane import TurnLane


def test_what_arrives_during_one_sessions_work_runs_before_the_next_sessions() -> None:
    anyio.run(_what_arrives_during_one_sessions_work_runs_before_the_next_sessions)


def test_a_waiter_cancelled_still_does_its_work() -> None:
    anyio.run(_a_waiter_cancelled_still_does_its_work)


def test_the_lane_is_free_again_after_an_error_in_a_section() -> None:
    anyio.run(_the_lane_is_free_again_after_an_error_in_a_section)


async def _what_arrives_during_one_sessions_work_runs_before_the_next_sessions() -> None:
    """A callback made ready during A's section (a socket's read, in a real run) runs before
    B's section, although B was waiting the whole time: the hand-over went through the loop."""
    lane, log = TurnLane(), []
    loop = asyncio.get_running_loop()

    async def session(name: str) -> None:
        async with lane.turn():
            log.append(f"{name} works")
            loop.call_soon(log.append, f"read during {name}")

    async with anyio.create_task_group() as tg:
        for name in ("a", "b", "c"):
            tg.start_soon(session, name)
    assert log == ["a works", "read during a", "b works", "read during b", "c works", "read during c"]
    assert lane.passes == 3


async def _a_waiter_cancelled_still_does_its_work() -> None:
    """What waits in the lane is a finished turn: cancelling it must not lose its record."""
    lane, done = TurnLane(), []
    release = anyio.Event()

    async def holder() -> None:
        async with lane.turn():
            await release.wait()  # held across an await only here, to make the waiter wait

    async def waiter(scope_ready: list[anyio.CancelScope]) -> None:
        with anyio.CancelScope() as scope:
            scope_ready.append(scope)
            async with lane.turn():
                done.append("recorded")
            await anyio.sleep(1)  # the cancellation lands here, after the work
        done.append("cancelled after" if scope.cancelled_caught else "not cancelled")

    scopes: list[anyio.CancelScope] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(holder)
        await anyio.sleep(0.01)
        tg.start_soon(waiter, scopes)
        await anyio.sleep(0.01)
        scopes[0].cancel()
        await anyio.sleep(0.01)
        assert done == []  # still waiting, shielded
        release.set()
    assert done == ["recorded", "cancelled after"]


async def _the_lane_is_free_again_after_an_error_in_a_section() -> None:
    lane = TurnLane()
    with pytest.raises(ValueError):
        async with lane.turn():
            raise ValueError("a checker's bug")
    with anyio.fail_after(1):
        async with lane.turn():
            pass


def test_a_section_cancelled_as_the_lane_is_handed_to_it_passes_the_lane_on() -> None:
    asyncio.run(_a_section_cancelled_as_the_lane_is_handed_to_it_passes_the_lane_on())


async def _a_section_cancelled_as_the_lane_is_handed_to_it_passes_the_lane_on() -> None:
    """A task cancelled from outside anyio (asyncio's own cancel) between being handed the lane
    and running: the lane goes to the next waiter, not held by no one for ever."""
    lane, entered = TurnLane(), []
    release = asyncio.Event()
    tasks: dict[str, asyncio.Task] = {}

    async def holder() -> None:
        async with lane.turn():
            await release.wait()
        tasks["w"].cancel()  # the lane was handed to w as the section ended; w has not run yet

    async def waiter(name: str) -> None:
        async with lane.turn():
            entered.append(name)

    h = asyncio.create_task(holder())
    await asyncio.sleep(0.01)
    tasks["w"] = asyncio.create_task(waiter("w"))
    tasks["x"] = asyncio.create_task(waiter("x"))
    await asyncio.sleep(0.01)
    release.set()
    await asyncio.wait_for(asyncio.gather(h, tasks["x"]), 1)
    assert tasks["w"].cancelled() and entered == ["x"]
    async with lane.turn():  # and free after
        entered.append("after")
    assert entered == ["x", "after"]


def test_starts_are_served_before_turns_that_waited_longer() -> None:
    anyio.run(_starts_are_served_before_turns_that_waited_longer)


async def _starts_are_served_before_turns_that_waited_longer() -> None:
    lane, order = TurnLane(), []
    release = anyio.Event()

    async def holder() -> None:
        async with lane.turn():
            await release.wait()

    async def section(name: str, first: bool) -> None:
        async with lane.turn(first=first):
            order.append(name)

    async with anyio.create_task_group() as tg:
        tg.start_soon(holder)
        await anyio.sleep(0.01)
        for name, first in (("turn a", False), ("start 1", True), ("turn b", False), ("start 2", True)):
            tg.start_soon(section, name, first)
            await anyio.sleep(0.01)
        release.set()
    assert order == ["start 1", "start 2", "turn a", "turn b"]
    assert lane.passes == 5
