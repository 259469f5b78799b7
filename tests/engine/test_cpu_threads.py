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


def test_openmp_spin_is_set_unless_the_user_set_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from dsv4bench.engine import cpu_threads

    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    cpu_threads.set_openmp_spin()
    import os

    assert os.environ["GOMP_SPINCOUNT"] == str(cpu_threads.SPIN_COUNT)
    monkeypatch.setenv("GOMP_SPINCOUNT", "77")
    cpu_threads.set_openmp_spin()
    assert os.environ["GOMP_SPINCOUNT"] == "77"


def test_engine_serve_sets_the_spin_before_torch_loads() -> None:
    # `dsv4bench engine serve` on a port it cannot bind: it fails after setting the spin and
    # importing the serving engine, and reports whether torch came after the setting
    code = textwrap.dedent("""
        import os, sys, builtins
        seen = {}
        real_import = builtins.__import__
        def spy(name, *a, **k):
            if name == "torch" and "at_torch" not in seen:
                seen["at_torch"] = os.environ.get("GOMP_SPINCOUNT")
            return real_import(name, *a, **k)
        builtins.__import__ = spy
        os.environ.pop("GOMP_SPINCOUNT", None)
        from dsv4bench.cli import main
        sys.argv = ["dsv4bench", "engine", "serve", "--port", "1", "--host", "256.0.0.1"]
        try:
            main()
        except SystemExit:
            pass
        print("SPIN", seen.get("at_torch"))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    from dsv4bench.engine.cpu_threads import SPIN_COUNT

    assert f"SPIN {SPIN_COUNT}" in out.stdout, (out.stdout, out.stderr[-2000:])


def test_engine_processes_sharing_the_cores_spin_as_libgomp_throttles(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from dsv4bench.engine import cpu_threads

    cores = os.cpu_count() or 1
    for omp, processes, want in (
        ("", 2, cpu_threads.SHARED_SPIN_COUNT),
        ("", 1, cpu_threads.SPIN_COUNT),
        ("1", 2, cpu_threads.SPIN_COUNT if cores >= 2 else cpu_threads.SHARED_SPIN_COUNT),
        ("4,2", 2, cpu_threads.SHARED_SPIN_COUNT if cores < 8 else cpu_threads.SPIN_COUNT),
        ("junk", 2, cpu_threads.SHARED_SPIN_COUNT),
    ):
        monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
        cpu_threads.set_openmp_spin(processes)
        assert os.environ["GOMP_SPINCOUNT"] == str(want), (omp, processes)
