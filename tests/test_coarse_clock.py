"""CoarseClock: deadlines kept in buckets and fired by one loop timer, never early, at most a tick late."""

from __future__ import annotations

import asyncio

from dsv4bench.loop.coarse_clock import TICK_S, CoarseClock


def run(coro):
    return asyncio.run(coro)


def test_a_deadline_fires_no_earlier_than_asked_and_at_most_a_tick_late():
    async def main():
        loop = asyncio.get_running_loop()
        clock = CoarseClock.of()
        fired: dict[float, float] = {}
        start = loop.time()
        for seconds in (0.0, 0.01, 0.07, 0.2, 0.13):
            clock.at(seconds, lambda s=seconds: fired.setdefault(s, loop.time() - start))
        await asyncio.sleep(0.2 + 2 * TICK_S + 0.05)
        return fired, clock.pending()

    fired, pending = run(main())
    assert sorted(fired) == [0.0, 0.01, 0.07, 0.13, 0.2] and pending == 0
    for asked, took in fired.items():
        # The loop may run a timer up to its clock's resolution early; a busy test machine, late.
        assert asked - 1e-3 <= took <= asked + TICK_S + 0.1, (asked, took)
    assert [s for s, _ in sorted(fired.items(), key=lambda kv: kv[1])] == [0.0, 0.01, 0.07, 0.13, 0.2]


def test_a_dropped_deadline_never_fires_and_its_neighbours_still_do():
    async def main():
        clock = CoarseClock.of()
        fired: list[str] = []
        a = clock.at(0.05, lambda: fired.append("a"))
        clock.at(0.05, lambda: fired.append("b"))
        alone = clock.at(0.1, lambda: fired.append("alone"))
        clock.drop(a)
        clock.drop(alone)  # its bucket empties: the timer set for it passes over it
        clock.drop(a)  # twice is no matter
        later = clock.at(0.15, lambda: fired.append("later"))
        await asyncio.sleep(0.15 + 2 * TICK_S + 0.05)
        clock.drop(later)  # fired already: no matter
        return fired, clock.pending()

    assert run(main()) == (["b", "later"], 0)


def test_an_earlier_deadline_set_after_a_later_one_is_not_kept_waiting_for_it():
    async def main():
        loop = asyncio.get_running_loop()
        clock = CoarseClock.of()
        fired: list[tuple[str, float]] = []
        start = loop.time()
        clock.at(5.0, lambda: fired.append(("late", loop.time() - start)))
        clock.at(0.05, lambda: fired.append(("soon", loop.time() - start)))
        await asyncio.sleep(0.05 + 2 * TICK_S + 0.05)
        return fired, clock.pending()

    fired, pending = run(main())
    assert [name for name, _ in fired] == ["soon"] and fired[0][1] < 0.5 and pending == 1


def test_a_callback_that_raises_is_the_loops_to_report_and_the_rest_still_run():
    async def main():
        loop = asyncio.get_running_loop()
        errors: list[dict] = []
        loop.set_exception_handler(lambda _, context: errors.append(context))
        clock = CoarseClock.of()
        fired: list[str] = []

        def boom() -> None:
            raise RuntimeError("listener broke")

        clock.at(0.01, boom)
        clock.at(0.01, lambda: fired.append("after"))
        await asyncio.sleep(0.01 + 2 * TICK_S + 0.05)
        return fired, [str(e.get("exception")) for e in errors]

    assert run(main()) == (["after"], ["listener broke"])


def test_each_loop_has_a_clock_of_its_own():
    async def clock_of_this_loop():
        return CoarseClock.of()

    first, second = run(clock_of_this_loop()), run(clock_of_this_loop())

    async def same_twice():
        return CoarseClock.of() is CoarseClock.of()

    assert first is not second and run(same_twice())


def test_a_clock_does_not_keep_its_loop_alive():
    import gc
    import weakref

    loop = asyncio.new_event_loop()
    CoarseClock.of(loop).at(10.0, lambda: None)
    gone = weakref.ref(loop)
    loop.close()
    del loop
    gc.collect()
    assert gone() is None
