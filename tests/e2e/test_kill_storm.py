"""Kill storms against the healthy replay server: killed turns are `killed`, never corruption."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .conftest import only_run_dir, run_cli, start_replay


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _run(srv, out: Path, *args: str) -> tuple[Path, dict[str, Any]]:
    r = run_cli("agents", "--url", srv.url, "--out", str(out), "-q", *args, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    run_dir = only_run_dir(out)
    return run_dir, json.loads((run_dir / "summary.json").read_text())


def test_kill_all_storm_at_concurrency_80_is_clean(clean_replay, tmp_path):
    run_dir, summary = _run(
        clean_replay, tmp_path / "out", "--concurrency", "80", "--duration", "30", "--kill", "all@4s"
    )
    assert summary["verdict"] == "CLEAN"
    turns = _jsonl(run_dir / "turns.jsonl")
    killed = [t for t in turns if t["status"] == "killed"]
    assert killed and summary["turns"]["killed"] == len(killed)
    assert summary["turns"]["corrupt"] == 0 and summary["turns"]["error"] == 0
    assert all(not t["verdicts"] for t in killed)
    events = _jsonl(run_dir / "events.jsonl")
    kills = [e for e in events if e["kind"] == "kill"]
    assert len(kills) == 1 and kills[0]["spec"] == "all@4s" and kills[0]["who"] == "all" and kills[0]["abort"] is False
    assert {t["session"] for t in killed} <= set(kills[0]["sessions"])
    # The load stopped at the kill: nothing started after it, and the run drained well before 30 s.
    kill_ns = kills[0]["t_ns"]
    assert not [e for e in events if e["kind"] == "session_start" and e["t_ns"] > kill_ns]
    ends = {e["session"]: e["reason"] for e in events if e["kind"] == "session_end"}
    assert all(ends[s] == "killed" for s in kills[0]["sessions"])
    assert next(e for e in events if e["kind"] == "run_end")["t_ns"] - kill_ns < 10e9


@pytest.fixture
def slow_first_token(tmp_path):
    """The healthy replay server, each answer's first byte 0.3 s late: sessions that started
    together turn in step, and without a wait of some length a kill can land when none waits."""
    srv = start_replay(tmp_path, fault_rate=0, latency=0.3)
    yield srv
    srv.stop()


def test_who_ttft_kills_only_turns_before_their_first_token(slow_first_token, tmp_path):
    run_dir, summary = _run(
        slow_first_token, tmp_path / "out", "--concurrency", "40", "--duration", "4", "--kill", "all@2s,who=ttft"
    )
    assert summary["verdict"] == "CLEAN"
    killed = [t for t in _jsonl(run_dir / "turns.jsonl") if t["status"] == "killed"]
    assert killed
    assert all(t["timings"].get("first_token_ns") is None for t in killed)
    kill = next(e for e in _jsonl(run_dir / "events.jsonl") if e["kind"] == "kill")
    assert kill["who"] == "ttft" and {t["session"] for t in killed} <= set(kill["sessions"])


def test_restart_relaunches_killed_sessions(clean_replay, tmp_path):
    run_dir, summary = _run(
        clean_replay, tmp_path / "out", "--concurrency", "20", "--duration", "4", "--kill", "all@1.5s,restart,abort"
    )
    assert summary["verdict"] == "CLEAN"
    events = _jsonl(run_dir / "events.jsonl")
    kill = next(e for e in events if e["kind"] == "kill")
    assert kill["abort"] is True and kill["sessions"]
    restarts = [e for e in events if e["kind"] == "session_restart"]
    assert {e["session"] for e in restarts} == set(kill["sessions"])
    restarted = {e["new_session"] for e in restarts}
    after = [t for t in _jsonl(run_dir / "turns.jsonl") if t["session"] in restarted]
    assert after and all(t["status"] == "ok" for t in after)


def test_drain_events_with_metrics(clean_replay, tmp_path):
    # The replay server serves no /metrics: every scrape fails, so the drain runs its full window.
    metrics = clean_replay.url.removesuffix("/v1") + "/metrics"
    run_dir, _ = _run(
        clean_replay,
        tmp_path / "out",
        "--concurrency",
        "4",
        "--sessions",
        "4",
        "--metrics",
        metrics,
        "--metrics-interval",
        "0.2",
        "--drain-timeout",
        "1",
    )
    events = _jsonl(run_dir / "events.jsonl")
    kinds = [e["kind"] for e in events]
    assert kinds.index("load_stopped") < kinds.index("drain_end") < kinds.index("run_end")
    drain = next(e for e in events if e["kind"] == "drain_end")
    assert drain["reason"] == "timeout" and 0.9 <= drain["drain_s"] < 3
    run = json.loads((run_dir / "run.json").read_text())
    if (Path(__file__).resolve().parents[2] / "dsv4bench" / "servers" / "wedge.py").exists():
        assert metrics in run["wedge"]  # the detector ran over this run's samples


def test_bad_kill_spec_is_a_one_line_error(tmp_path):
    r = run_cli(
        "agents",
        "--url",
        "http://127.0.0.1:9/v1",
        "--duration",
        "5",
        "--kill",
        "all@3s,who=idle",
        "--out",
        str(tmp_path),
    )
    assert r.returncode == 2
    assert "who must be one of all, ttft, toolcall" in " ".join(r.stderr.split())
