"""The driver builds a session's world in lane sections of up to BUILD_SECTION_S
(driver.in_lane_steps), with the loop's I/O and the other sessions' sections in between; the
session is the one built at once. `step_clock` makes every step overrun the budget, so each
step is a section of its own and the tests can count them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator

import anyio
import pytest

from dsv4bench.agents import FAMILIES
from dsv4bench.harness.driver import BUILD_SECTION_S, in_lane_steps
from dsv4bench.harness.session import AgentSession, SessionConfig
from dsv4bench.loop.turn_lane import TurnLane

CONFIG = SessionConfig(model="m")


def step_clock() -> Callable[[], float]:
    """A clock that moves a whole section's budget each time it is read."""
    now = [0.0]

    def read() -> float:
        now[0] += BUILD_SECTION_S
        return now[0]

    return read


def still_clock() -> float:
    return 0.0


def pauses(name: str, seed: int) -> int:
    """How many times the world of `name` for `seed` pauses while it is built."""
    steps, n = FAMILIES[name].build_world_steps(seed), 0
    for _ in steps:
        n += 1
    return n


def test_each_step_is_a_lane_section_with_the_loop_in_between() -> None:
    anyio.run(_each_step_is_a_lane_section_with_the_loop_in_between)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_session_built_in_the_lane_is_the_session_built_at_once(name: str) -> None:
    anyio.run(_a_session_built_in_the_lane_is_the_session_built_at_once, name)


def test_sessions_built_together_take_the_lane_in_turn() -> None:
    anyio.run(_sessions_built_together_take_the_lane_in_turn)


def test_steps_share_a_section_until_it_has_run_its_budget() -> None:
    anyio.run(_steps_share_a_section_until_it_has_run_its_budget)


def test_a_build_is_served_before_the_turns_waiting() -> None:
    anyio.run(_a_build_is_served_before_the_turns_waiting)


def test_a_build_the_load_outlived_stops_at_its_next_step() -> None:
    anyio.run(_a_build_the_load_outlived_stops_at_its_next_step)


def test_a_build_cancelled_stops_at_its_next_step() -> None:
    anyio.run(_a_build_cancelled_stops_at_its_next_step)


def build(
    log: list[str], n: int, closed: list[bool] | None = None, during: Callable[[int], None] | None = None
) -> Generator[None, None, str]:
    """A build of `n` steps that logs each, and a socket read (call_soon) made during each;
    `during(i)` runs in step i."""
    loop = asyncio.get_running_loop()
    try:
        for i in range(n):
            log.append(f"step {i}")
            loop.call_soon(log.append, f"read during {i}")
            if during is not None:
                during(i)
            if i < n - 1:
                yield
        return "built"
    finally:
        if closed is not None:
            closed.append(True)


async def _each_step_is_a_lane_section_with_the_loop_in_between() -> None:
    lane, log = TurnLane(), []
    assert await in_lane_steps(lane, build(log, 3), lambda: False, step_clock()) == "built"
    assert lane.passes == 3
    await anyio.sleep(0)  # the last read runs once the loop polls again
    assert log == ["step 0", "read during 0", "step 1", "read during 1", "step 2", "read during 2"]


async def _a_session_built_in_the_lane_is_the_session_built_at_once(name: str) -> None:
    fam = FAMILIES[name]
    for seed in (0, 5, 300_017):
        lane = TurnLane()
        sess = await in_lane_steps(lane, AgentSession.in_steps("s1", fam, seed, CONFIG), lambda: False, step_clock())
        assert sess is not None
        assert lane.passes == pauses(name, seed) + 1  # one section per step, none more
        once = AgentSession("s1", fam, seed, CONFIG)
        assert sess.world.digest() == once.world.digest()
        assert sess.task == once.task
        assert sess.next_request() == once.next_request()


async def _sessions_built_together_take_the_lane_in_turn() -> None:
    """Two ops sessions started together: their steps alternate, neither's build holds the lane."""
    lane, order = TurnLane(), []
    ops = FAMILIES["ops"]

    def traced(sid: str, seed: int) -> Generator[None, None, AgentSession]:
        steps = AgentSession.in_steps(sid, ops, seed, CONFIG)
        while True:
            order.append(sid)
            try:
                next(steps)
            except StopIteration as done:
                return done.value
            yield

    async def start(sid: str, seed: int) -> None:
        assert await in_lane_steps(lane, traced(sid, seed), lambda: False, step_clock()) is not None

    async with anyio.create_task_group() as tg:
        tg.start_soon(start, "a", 1)
        tg.start_soon(start, "b", 2)
    n = pauses("ops", 1) + 1
    assert n >= 5 and pauses("ops", 2) + 1 == n
    assert order == ["a", "b"] * n
    assert lane.passes == 2 * n


async def _a_build_the_load_outlived_stops_at_its_next_step() -> None:
    lane, log, closed = TurnLane(), [], []
    assert await in_lane_steps(lane, build(log, 5, closed), lambda: True, step_clock()) is None
    assert lane.passes == 1 and log[0] == "step 0" and "step 1" not in log
    assert closed == [True]  # the generator ended, not left to the collector


async def _a_build_cancelled_stops_at_its_next_step() -> None:
    lane, log, closed = TurnLane(), [], []
    with anyio.CancelScope() as scope:

        def cancel_in_step_1(i: int) -> None:
            if i == 1:
                scope.cancel()  # as a task group's cancellation would, while the step runs

        await in_lane_steps(lane, build(log, 5, closed, cancel_in_step_1), lambda: False, step_clock())
    assert scope.cancelled_caught
    assert lane.passes == 2 and "step 2" not in log
    assert closed == [True]


async def _steps_share_a_section_until_it_has_run_its_budget() -> None:
    lane, log = TurnLane(), []
    assert await in_lane_steps(lane, build(log, 6), lambda: False, still_clock) == "built"
    assert lane.passes == 1  # never over budget: the whole build in one section
    fam = FAMILIES["ops"]
    lane = TurnLane()
    sess = await in_lane_steps(lane, AgentSession.in_steps("s1", fam, 3, CONFIG), lambda: False)
    assert sess is not None and sess.world.digest() == AgentSession("s1", fam, 3, CONFIG).world.digest()
    assert 1 <= lane.passes <= pauses("ops", 3) + 1  # by the real clock: some steps shared a section


async def _a_build_is_served_before_the_turns_waiting() -> None:
    """Turns queued before a build's section still go after it: the lane serves starts first."""
    lane, order = TurnLane(), []
    release = anyio.Event()

    async def holder() -> None:
        async with lane.turn():
            await release.wait()

    async def turn(name: str) -> None:
        async with lane.turn():
            order.append(name)

    async def start() -> None:
        await in_lane_steps(lane, build([], 2), lambda: False, step_clock())
        order.append("built")

    async with anyio.create_task_group() as tg:
        tg.start_soon(holder)
        await anyio.sleep(0.01)
        tg.start_soon(turn, "turn 1")
        tg.start_soon(turn, "turn 2")
        await anyio.sleep(0.01)
        tg.start_soon(start)
        await anyio.sleep(0.01)
        release.set()
    # The build's first section goes first; its second queues behind the turn handed the lane
    # as the first section ended, and still before the turn that waited longer.
    assert order == ["turn 1", "built", "turn 2"]
