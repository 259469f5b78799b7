"""With no --metrics, `agents` finds the server's own /metrics (SGLang's or vLLM's names) and
checks the wedge there; a server without one is reported as not checked, never as healthy."""

from __future__ import annotations

import json

import httpx

from .conftest import only_run_dir, run_cli


def test_the_servers_own_metrics_are_found_and_a_stuck_queue_is_a_wedge(wedge_server, tmp_path):
    httpx.post(f"{wedge_server}/control", json={"stuck": {"sglang:num_decode_transfer_queue_reqs": 40}}, timeout=5)
    r = run_cli("agents", "--url", f"{wedge_server}/v1", "--sessions", "1", "--max-turns", "1", "--no-stream",
                "--metrics-interval", "0.2", "--drain-timeout", "6", "--out", str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"found {wedge_server}/metrics" in r.stderr
    summary = json.loads((only_run_dir(tmp_path) / "summary.json").read_text())
    assert summary["verdict"] == "WEDGE"
    assert summary["wedge"][f"{wedge_server}/metrics"]["codes"] == ["queue_stuck"]
