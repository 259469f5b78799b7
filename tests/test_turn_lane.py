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
