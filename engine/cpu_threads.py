"""Torch's CPU thread team belongs to the engine loop's thread.

Torch runs its CPU ops on GNU OpenMP, and OpenMP gives every thread that runs a parallel op a
team of its own, kept as long as that thread lives. Once a process holds more OpenMP threads
than it has cores, libgomp throttles every team: between two parallel regions its threads spin
100 times instead of 300,000 and then sleep, so each of the thousands of parallel regions in a
decode step waits for a sleeping thread to be woken. Building the model and the pools on the
main thread and then stepping on the engine loop's thread is exactly that: two teams on 2 cores.
A batch-80 decode step of the default config took 33-42 ms there against 27-30 ms when the
stepping thread's team was the only one (same process, same step; bench-plan.md, CPU decode).

So the torch work done before the loop starts runs on a thread that ends when it is done: a
thread's team is let go when the thread exits, and the loop's team is then the only one. (Other
threads that copy KV pages, the host tier's loader and the PD transfers, can still start teams
of their own when a copy is large enough to run in parallel.)

Unthrottled, libgomp spins 300,000 times, long enough to hold a core the harness beside the
engine needs (README's main job shares 2 cores between them): that job took 177 s against 165 s
before; with a core taken by a busy loop, decode fell to half. The engine's processes spin
10,000 times (GOMP_SPINCOUNT, read by libgomp when torch loads, so set before that; a value the
user set stays): README's job 162 s, batch-80 decode 2,139-2,458 tok/s (bench-plan.md). Several
engine processes on one machine (a PD deployment's two halves) would together hold more OpenMP
threads than cores, where libgomp's own throttle cannot see across processes: they spin 100
times, as a throttled team does. (That follows libgomp's rule rather than a measurement: a PD
probe test on this 2-core machine took 12-14 s at either count.)
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

SPIN_COUNT = 10_000  # libgomp's spins between two parallel regions (module docstring)
SHARED_SPIN_COUNT = 100  # libgomp's own, once its threads outnumber the cores


def set_openmp_spin(engine_processes: int = 1) -> None:
    """GOMP_SPINCOUNT for this process and its children, `engine_processes` of them stepping a
    model on this machine, unless the user set it; takes effect only where torch has not been
    imported yet."""
    first = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()  # "4" or "4,2" (nested)
    threads_each = int(first) if first.isdigit() and int(first) > 0 else os.cpu_count() or 1
    shared = engine_processes > 1 and engine_processes * threads_each > (os.cpu_count() or 1)
    os.environ.setdefault("GOMP_SPINCOUNT", str(SHARED_SPIN_COUNT if shared else SPIN_COUNT))


def on_passing_thread(build: Callable[[], T], name: str = "dsv4-build") -> T:
    """build() run on a thread of its own that ends before this returns; its result, or the
    exception it raised, here."""
    result: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result.append(build())
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread as is
            failure.append(e)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]
