"""With no --metrics, `agents` finds the server's own /metrics (SGLang's or vLLM's names) and
checks the wedge there; a server without one is reported as not checked, never as healthy."""

from __future__ import annotations

import json

import httpx

from .conftest import only_run_dir, run_cli


def test_the_servers_own_metrics_are_found_and_a_stuck_queue_is_a_wedge(wedge_server, tmp_path):
    httpx.post(f"{wedge_server}/control", json={"stuck": {"sglang:num_decode_transfer_queue_reqs": 40}}, timeout=5)
    r = run_cli(
        "agents",
        "--url",
        f"{wedge_server}/v1",
        "--sessions",
        "1",
        "--max-turns",
        "1",
        "--no-stream",
        "--metrics-interval",
        "0.2",
        "--drain-timeout",
        "6",
        "--out",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"found {wedge_server}/metrics" in r.stderr
    summary = json.loads((only_run_dir(tmp_path) / "summary.json").read_text())
    assert summary["verdict"] == "WEDGE"
    assert summary["wedge"][f"{wedge_server}/metrics"]["codes"] == ["queue_stuck"]


def test_a_routers_metrics_alone_do_not_make_a_checked_clean(wedge_server, tmp_path):
    # A router's gauges count its own requests; the queues a wedge sticks in are its workers'.
    httpx.post(f"{wedge_server}/control", json={"engine_type": "router", "server_info": True}, timeout=5)
    r = run_cli(
        "agents",
        "--url",
        f"{wedge_server}/v1",
        "--sessions",
        "1",
        "--max-turns",
        "1",
        "--no-stream",
        "--metrics-interval",
        "0.2",
        "--drain-timeout",
        "1",
        "--out",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "a router's: its workers' queues are not in it" in r.stderr
    run_dir = only_run_dir(tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["verdict"] == "CLEAN"
    assert summary["wedge_checked"] is False and summary["wedge_unchecked_reason"] == "only a router was scraped"
    report = (run_dir / "report.md").read_text()
    assert "**CLEAN** (wedge not checked: only a router was scraped; not exercised: " in report


def test_a_server_without_metrics_is_not_checked(tmp_path):
    from .conftest import start_fixture_server

    srv = start_fixture_server("hostile_server.py", tmp_path, "/health", "--modes", "normal")
    try:
        r = run_cli(
            "agents",
            "--url",
            f"{srv.root}/v1",
            "--sessions",
            "1",
            "--max-turns",
            "1",
            "--quiet",
            "--out",
            str(tmp_path / "runs"),
        )
        assert r.returncode == 0, r.stderr
        assert "CLEAN (wedge not checked)" in r.stdout
        summary = json.loads((only_run_dir(tmp_path / "runs") / "summary.json").read_text())
        assert summary["wedge_checked"] is False and summary["wedge_unchecked_reason"] == "no --metrics endpoint"
    finally:
        srv.stop()
