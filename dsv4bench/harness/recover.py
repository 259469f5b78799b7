"""`--recover-cmd`: after a wedge, run the user's recovery (restart the services, say) and
measure the time until every server answers /health with 200 and a canary completes: the
70-second manual probe of the incident, timed."""

from __future__ import annotations

import subprocess
import time
from typing import Any

import anyio
import httpx

from dsv4bench.servers.canary import check_canary, check_health
from dsv4bench.servers.preflight import root_of
from dsv4bench.history.redact import redact_command, redact_credentials


async def wait_healthy(
    base_urls: list[str], model: str | None, timeout: float, poll_s: float = 0.5, api_key: str | None = None
) -> float | None:
    """Seconds until every base URL (…/v1) answers /health 200 and a canary; None on timeout."""
    t0 = time.monotonic()
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(trust_env=False, headers=headers) as client:
        while time.monotonic() - t0 < timeout:
            left = max(0.5, timeout - (time.monotonic() - t0))
            checks = [await check_health(client, root_of(u), timeout=min(5.0, left)) for u in base_urls]
            if all(c.status == 200 for c in checks):
                canaries = [await check_canary(client, u, model, timeout=min(10.0, left)) for u in base_urls]
                if all(c.ok for c in canaries):
                    return round(time.monotonic() - t0, 3)
            await anyio.sleep(poll_s)
    return None


def run_recovery(
    cmd: str, base_urls: list[str], model: str | None, timeout: float = 300.0, api_key: str | None = None
) -> dict[str, Any]:
    """Run `cmd` in a shell, then time the way back to healthy. Never raises for the command's
    own failure: its exit code and output tail are part of the record, credential-shaped text
    masked (redact.py); the run's own key is scrubbed by the history writer, as everywhere."""
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=timeout)
        code, tail = p.returncode, (p.stdout + p.stderr)[-500:]
    except subprocess.TimeoutExpired:
        code, tail = None, f"the command ran past {timeout:g} s"
    cmd_s = round(time.monotonic() - t0, 3)
    healthy = anyio.run(wait_healthy, base_urls, model, max(1.0, timeout - cmd_s), 0.5, api_key)
    return {
        "cmd": redact_command(cmd),
        "exit_code": code,
        "output_tail": redact_credentials(tail),
        "cmd_s": cmd_s,
        "healthy_after_s": None if healthy is None else round(cmd_s + healthy, 3),
    }
