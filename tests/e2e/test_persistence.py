"""Corruption that persists, end to end: a server poisoned for good after a while gives POISONED
(and, with a --recover-cmd that restarts it, the time until fresh sessions are clean); its twin,
whose corruption stopped within the load, is not poisoned."""

from __future__ import annotations

import json
import sys

import pytest

from tests.e2e.conftest import only_run_dir, run_cli, start_fixture_server

LOAD = ("--concurrency", "1", "--sessions", "8", "--max-turns", "6", "--seed", "3", "--drain-timeout", "1")


@pytest.fixture
def poison(tmp_path):
    servers = []

    def start(*args: str) -> str:
        servers.append(start_fixture_server("poison_server.py", tmp_path, "/health", "--latency", "0.05", *args))
        return servers[-1].root

    yield start
    for s in servers:
        s.stop()


def run_agents(tmp_path, root: str, *extra: str) -> tuple[dict, dict, str]:
    out = tmp_path / "out"
    p = run_cli("agents", "--url", f"{root}/v1", *LOAD, "--metrics-interval", "0.2", "--out", str(out), "-q", *extra)
    assert p.returncode == 0, p.stderr
    run_dir = only_run_dir(out)
    summary = json.loads((run_dir / "summary.json").read_text())
    return summary, json.loads((run_dir / "run.json").read_text()), (run_dir / "report.md").read_text()


def test_a_server_poisoned_for_good_is_poisoned_and_a_restart_is_timed_to_clean(tmp_path, poison) -> None:
    root = poison("--poison-after", "12")
    restart = f"{sys.executable} -c \"import httpx; httpx.post('{root}/admin/restart')\""
    summary, run_info, report = run_agents(tmp_path, root, "--persist-sessions", "2", "--recover-cmd", restart)
    assert summary["verdict"] == "POISONED"
    block = summary["persistence"]
    assert block["poisoned"] is True and block["code"] == "poisoned_state"
    assert [s["outcome"] for s in block["sessions"]] == ["corrupt", "corrupt"]
    # The replayed seeds are those of sessions that were clean early in the run.
    turns = [json.loads(line) for line in (tmp_path / "out").glob("*/turns.jsonl").__next__().read_text().splitlines()]
    replayed = {s["replays"] for s in block["sessions"]}
    assert replayed and all(not t["verdicts"] for t in turns if t["session"] in replayed)
    # Its sessions are no turns of the run.
    assert not any(t["session"].startswith("persist") for t in turns)
    after = block["after_recovery"]
    assert after["clean_after_s"] is not None and after["clean_after_s"] >= run_info["recovery"]["cmd_s"]
    assert "## Corruption that persists" in report and "**Poisoned**" in report
    assert "dsml_leak_content" in summary["first_findings"]
    assert "## Where it started" in report and report.rstrip().endswith("```")  # ends with the commands
    assert "dsv4bench sweep --concurrency" in report


def test_corruption_that_stopped_within_the_load_is_not_poisoned(tmp_path, poison) -> None:
    root = poison("--poison-after", "12", "--heal-after", "20")
    summary, _, report = run_agents(tmp_path, root, "--persist-sessions", "2")
    assert summary["verdict"] == "CORRUPTION"
    block = summary["persistence"]
    assert block["poisoned"] is False and [s["outcome"] for s in block["sessions"]] == ["clean", "clean"]
    assert "Not poisoned" in report


def test_persist_sessions_zero_switches_the_check_off(tmp_path, poison) -> None:
    summary, run_info, report = run_agents(tmp_path, poison("--poison-after", "12"), "--persist-sessions", "0")
    assert summary["verdict"] == "CORRUPTION" and summary["persistence"] is None
    assert "persistence" not in run_info and "## Corruption that persists" not in report
