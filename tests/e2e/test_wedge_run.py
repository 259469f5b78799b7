"""The wedge half of a run, end to end: a server whose queues stick or whose /health lies,
found by `dsv4bench agents` after the load, with verdict WEDGE and --fail-on wedge."""

from __future__ import annotations

import json
import sys

import httpx

from .conftest import only_run_dir, run_cli


def agents(root: str, out, *extra: str):
    return run_cli(
        "agents",
        "--url",
        f"{root}/v1",
        "--metrics",
        f"{root}/metrics",
        "--metrics-interval",
        "0.2",
        "--sessions",
        "2",
        "--concurrency",
        "2",
        "--max-turns",
        "1",
        "--no-stream",
        "--quiet",
        "--out",
        str(out),
        *extra,
    )


def test_healthy_server_drains_and_is_clean(wedge_server, tmp_path):
    r = agents(wedge_server, tmp_path, "--drain-timeout", "5", "--fail-on", "wedge")
    assert r.returncode == 0, r.stdout + r.stderr
    run = json.loads((only_run_dir(tmp_path) / "run.json").read_text())
    assert all(not w["codes"] for w in run["wedge"].values())


def test_stuck_decode_transfer_queue_is_a_wedge(wedge_server, tmp_path):
    httpx.post(f"{wedge_server}/control", json={"stuck": {"sglang:num_decode_transfer_queue_reqs": 58}}, timeout=5)
    r = agents(wedge_server, tmp_path, "--drain-timeout", "6", "--fail-on", "wedge")
    assert r.returncode == 1, r.stdout + r.stderr
    run_dir = only_run_dir(tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["verdict"] == "WEDGE"
    found = summary["wedge"][f"{wedge_server}/metrics"]
    assert found["codes"] == ["queue_stuck"] and "num_decode_transfer_queue_reqs" in " ".join(found["details"])
    assert "58" in (run_dir / "report.md").read_text()


def test_lying_health_and_a_hanging_canary(wedge_server, tmp_path):
    httpx.post(f"{wedge_server}/control", json={"wedged": True, "lie_health": True}, timeout=5)
    r = agents(wedge_server, tmp_path, "--drain-timeout", "1", "--ttft-timeout", "1", "--canary-timeout", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads((only_run_dir(tmp_path) / "summary.json").read_text())
    codes = {c for w in summary["wedge"].values() for c in w["codes"]}
    assert {"canary_timeout", "health_lies"} <= codes and summary["verdict"] == "WEDGE"


def test_recover_cmd_is_timed(wedge_server, tmp_path):
    httpx.post(f"{wedge_server}/control", json={"stuck": {"sglang:num_prefill_inflight_queue_reqs": 1}}, timeout=5)
    fix = f"{sys.executable} -c \"import httpx; httpx.post('{wedge_server}/control', json={{'reset': True}})\""
    r = agents(wedge_server, tmp_path, "--drain-timeout", "6", "--recover-cmd", fix)
    assert r.returncode == 0, r.stdout + r.stderr
    run = json.loads((only_run_dir(tmp_path) / "run.json").read_text())
    assert run["recovery"]["exit_code"] == 0 and run["recovery"]["healthy_after_s"] is not None
