"""--recover-cmd's timing: a wedged server, a recovery command that un-wedges it, the time to healthy."""

from __future__ import annotations

import sys

import httpx

from dsv4bench.harness.recover import run_recovery


def test_recovery_command_is_timed_to_healthy(wedge_server):
    root = wedge_server
    httpx.post(f"{root}/control", json={"wedged": True, "lie_health": True}, timeout=5)
    # Still wedged after a command that does nothing: never healthy within the timeout.
    stuck = run_recovery("true", [f"{root}/v1"], None, timeout=3)
    assert stuck["exit_code"] == 0 and stuck["healthy_after_s"] is None
    fix = f"{sys.executable} -c \"import httpx; httpx.post('{root}/control', json={{'reset': True}})\""
    rec = run_recovery(fix, [f"{root}/v1"], None, timeout=20)
    assert rec["exit_code"] == 0 and rec["healthy_after_s"] is not None
    assert rec["cmd_s"] <= rec["healthy_after_s"] < 20
