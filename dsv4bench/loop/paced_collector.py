"""The garbage collector while the load runs: short young collections on a clock, and nothing
older walked.

CPython collects generation 0 when its allocations less its deallocations pass a threshold. Under
load most deallocations are of older objects (a turn's records, freed when it ends), so the count
lags the objects actually waiting: one young collection at 1,000 sessions walked 48,000 objects
(42 ms), and at 2,000 sessions young ones took up to 96 ms and a full one 190 ms, each a pause
of the whole loop, during which streams' next chunks queue up behind their first (bench-plan.md,
"Scale in one process"). So, during the load:
- automatic collection is off, and a task collects generation 0 every PERIOD_S: a collection
  then walks only what was made since the last one (at most 6 ms at 2,000 sessions);
- what survives it is frozen (`gc.freeze`), so no collection walks the sessions' heap again;
- a cycle that becomes garbage only after it was frozen waits, so when the process's memory
  has doubled since the last full collection and grown by its allowance (half the memory the
  machine had available when the load started, AMNESTY_MIN_BYTES at least), one full
  collection of everything runs: a pause the lag clock records as the harness's own stall.
  The allowance is wide because the pause grows with the heap (759 ms at 5,000 sessions, whose
  worlds and transcripts passed a fixed 1 GiB mid-run) while what it frees is small (about one
  cycle a turn is left, measured): it is spent only where memory would otherwise run short.
  Memory, not the frozen heap, is weighed: `gc.get_freeze_count` walks the whole heap, 60 ms
  at 2,000 sessions;
- afterwards everything is unfrozen and the collector runs as before.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import anyio
import anyio.abc

PERIOD_S = 0.025  # 25 ms: collections of at most 6 ms at 2,000 sessions; at 50 ms, 8 ms
# A full collection never comes sooner than this much growth: the sessions' worlds as they start
# (about 180 KiB a session) are no leak, and at 256 MiB the start of 1,500 sessions set one off.
AMNESTY_MIN_BYTES = 1024 * 1024 * 1024
AMNESTY_CHECK_S = 10.0  # how often the memory is weighed


def rss_bytes() -> int:
    """This process's resident memory (Linux: now; elsewhere: its peak); 0 where unknown."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    except (ImportError, OSError):
        return 0


def available_bytes() -> int:
    """The memory the machine can still give (Linux: MemAvailable); 0 where unknown."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def growth_allowance(available: int) -> int:
    """How far memory may grow before the amnesty: half of what was available, at least
    AMNESTY_MIN_BYTES (where the machine does not say what it has)."""
    return max(AMNESTY_MIN_BYTES, available // 2)


@contextmanager
def paced_collection(
    tg: anyio.abc.TaskGroup,
    period_s: float = PERIOD_S,
    check_s: float = AMNESTY_CHECK_S,
    min_growth: int | None = None,
    weigh: Callable[[], int] = rss_bytes,
) -> Iterator[None]:
    """Within: the collector as the module docstring says, its clock a task in `tg`; on exit,
    as it was. (No task group of its own: the load's errors reach the caller as they are.)
    `min_growth`: the amnesty's allowance; None: growth_allowance() of this machine now."""
    if min_growth is None:
        min_growth = growth_allowance(available_bytes())
    was_enabled = gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()
    scope = anyio.CancelScope()
    tg.start_soon(_collect, scope, period_s, check_s, min_growth, weigh)
    try:
        yield
    finally:
        scope.cancel()
        gc.unfreeze()
        if was_enabled:
            gc.enable()


async def _collect(
    scope: anyio.CancelScope, period_s: float, check_s: float, min_growth: int, weigh: Callable[[], int]
) -> None:
    with scope:
        settled = weigh()  # the memory after the last full collection
        weighed = anyio.current_time()
        while True:
            await anyio.sleep(period_s)
            if scope.cancel_called:  # woken in the pass that ended the load: the collector is restored
                return
            gc.collect(0)
            gc.freeze()
            if anyio.current_time() - weighed < check_s:
                continue
            weighed = anyio.current_time()
            if settled and weigh() > max(2 * settled, settled + min_growth):
                gc.unfreeze()
                gc.collect()
                gc.freeze()
                settled = weigh()
