"""The bundled engine on a pool the default load fits in: the default run says no eviction was
reached, and `--cache-pressure 3` sizes the sessions past the pool, reaches evictions and loads
back from the host tier, and says so: in the plan before the load, summary.json and the report."""

from __future__ import annotations

import json
import subprocess

import pytest

from dsv4bench.engine.launcher import start_engine
from tests.e2e.conftest import only_run_dir, run_cli

pytest.importorskip("torch")

POOL_PAGES = 256  # 8,192 tokens: two short sessions fit it, a pressure of 2 does not


@pytest.fixture(scope="module")
def engine():
    """One bundled engine with HiCache over a small device pool, for both runs."""
    with start_engine(["--hicache", f"--num-pages={POOL_PAGES}"]) as ep:
        yield ep.roots[0]


def _run(engine: str, out, *flags: str) -> tuple[subprocess.CompletedProcess, dict, str]:
    r = run_cli("agents", "--url", f"{engine}/v1", "--out", str(out), "--persist-sessions", "0", *flags, timeout=240)
    assert "Traceback" not in r.stderr, r.stderr
    run_dir = only_run_dir(out)
    return r, json.loads((run_dir / "summary.json").read_text()), (run_dir / "report.md").read_text()


def test_the_default_load_says_it_reached_no_eviction(engine, tmp_path):
    r, summary, report = _run(engine, tmp_path, "--concurrency", "2", "--sessions", "2", "--max-turns", "2", "-q")
    assert summary["verdict"] == "CLEAN", r.stdout + r.stderr
    cache = summary["cache"]
    assert cache["pool"]["tokens"] == POOL_PAGES * 32
    assert cache["eviction_reached"] is False
    assert [g["gap"] for g in summary["coverage"]][0] == "no eviction reached"
    assert "no eviction reached" in report and "--cache-pressure 2" in report
    assert "eviction" in r.stdout.splitlines()[-1]  # the verdict line names the gap


def test_cache_pressure_three_reaches_evictions_and_host_loads_and_says_so(engine, tmp_path):
    r, summary, report = _run(
        engine, tmp_path, "--concurrency", "4", "--sessions", "4", "--max-turns", "6", "--cache-pressure", "3"
    )
    assert "cache plan: KV pool 8,192 tokens" in r.stderr and "3.00x the pool" in r.stderr, r.stderr
    assert summary["verdict"] in ("CLEAN", "CORRUPTION"), r.stdout  # the small model's own slips are its own
    cache = summary["cache"]
    assert cache["plan"]["reached"] == pytest.approx(3.0, rel=0.05)
    assert cache["eviction_reached"] is True and cache["host_reads_reached"] is True
    (server,) = cache["servers"].values()
    assert server["evicted_tokens"] > 0 and server["load_back_tokens"] > 0
    assert cache["prefix_sources"]["host"]["total"] > 0  # turns whose prefix came back from host, as usage said
    assert cache["deepest_prompt_per_session"]["max"] > POOL_PAGES * 32 / 4  # sessions grew past the short ones
    gaps = [g["gap"] for g in summary["coverage"]]
    assert "no eviction reached" not in gaps and "host tier never read" not in gaps
    assert "Eviction from the device pool: reached. Reads back from the host tier: reached." in report
