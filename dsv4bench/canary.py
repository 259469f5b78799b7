"""Canary and /health probes: the two small requests a wedge check sends after the drain window.

A canary is one short, non-streamed chat completion with a tight deadline: a wedged server
accepts the connection and then never answers, so only a real generation request tells a
serving server from one whose `/health` merely answers. Both functions return plain dicts
(the shapes wedge.detect_wedge reads) and never raise for network trouble.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import httpx

CANARY_PROMPT = "Reply with the single word OK."


def _err(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:200]


async def canary(client: httpx.AsyncClient, base_url: str, model: str | None,
                 timeout: float = 10.0) -> dict[str, Any]:
    """One max_tokens=4 chat completion against `base_url` (…/v1); `ok` only for a 200 with choices."""
    t_ns = time.monotonic_ns()
    body = {"model": model or "default", "messages": [{"role": "user", "content": CANARY_PROMPT}],
            "max_tokens": 4, "temperature": 0, "stream": False}
    ok, error = False, None
    # httpx's timeout is per phase (connect, each read); a server that trickles bytes could
    # outlive it, so the whole request also runs under one wall-clock deadline.
    with anyio.move_on_after(timeout) as scope:
        try:
            r = await client.post(base_url.rstrip("/") + "/chat/completions", json=body, timeout=timeout)
            if r.status_code != 200:
                error = f"HTTP {r.status_code}: {r.text[:120]}"
            elif not r.json().get("choices"):
                error = "answer without choices"
            else:
                ok = True
        except httpx.TimeoutException:
            error = f"timeout after {timeout:g} s"
        except (httpx.HTTPError, ValueError) as e:
            error = _err(e)
    if scope.cancelled_caught:
        error = f"timeout after {timeout:g} s"
    return {"t_ns": t_ns, "endpoint": base_url, "ok": ok,
            "latency_s": round((time.monotonic_ns() - t_ns) / 1e9, 3), "error": error}


async def health(client: httpx.AsyncClient, root_url: str, path: str = "/health",
                 timeout: float = 5.0) -> dict[str, Any]:
    """GET root_url + path; `status` is the HTTP status, or None when nothing answered in time."""
    t_ns = time.monotonic_ns()
    status: int | None = None
    error: str | None = None
    with anyio.move_on_after(timeout) as scope:
        try:
            status = (await client.get(root_url.rstrip("/") + path, timeout=timeout)).status_code
        except httpx.TimeoutException:
            error = f"timeout after {timeout:g} s"
        except httpx.HTTPError as e:
            error = _err(e)
    if scope.cancelled_caught:
        error = f"timeout after {timeout:g} s"
    return {"t_ns": t_ns, "endpoint": root_url.rstrip("/") + path, "status": status,
            "latency_s": round((time.monotonic_ns() - t_ns) / 1e9, 3), "error": error}
