"""engine/cpu_threads.py: torch work before the loop starts runs on a thread that ends, and
its OpenMP team (the threads the engine loop's team would otherwise share the cores with)
ends with it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from dsv4bench.engine.cpu_threads import on_passing_thread


def test_returns_the_result_and_raises_the_failure_of_its_build() -> None:
    import threading

    seen: list[str] = []
    assert on_passing_thread(lambda: seen.append(threading.current_thread().name) or 7) == 7
    assert seen and seen[0] != threading.current_thread().name

    def fail() -> None:
        raise ValueError("no weights")

    with pytest.raises(ValueError, match="no weights"):
        on_passing_thread(fail)


@pytest.mark.skipif(torch.get_num_threads() < 2, reason="one CPU thread: torch starts no OpenMP team")
def test_a_passing_threads_openmp_team_ends_with_it() -> None:
    # In a fresh process: a parallel op on the main thread leaves its team's thread behind; the
    # same op on a passing thread leaves nothing.
    code = textwrap.dedent("""
        import os, time, torch
        from dsv4bench.engine.cpu_threads import on_passing_thread
        def threads():
            return len(os.listdir("/proc/self/task"))
        before = threads()
        on_passing_thread(lambda: torch.ones(1 << 24).mul_(2).sum().item())
        # the team is let go by the thread's exit, just after join() has returned
        deadline = time.monotonic() + 5
        while threads() > before and time.monotonic() < deadline:
            time.sleep(0.01)
        after_passing = threads()
        torch.ones(1 << 24).mul_(2).sum().item()
        after_main = threads()
        print(before, after_passing, after_main)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    before, after_passing, after_main = map(int, out.stdout.split())
    assert after_passing == before, out.stdout
    assert after_main > before, out.stdout  # the main thread's team stays: what the engine avoids
