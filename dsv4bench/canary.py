"""Canary and /health probes: the two small requests a wedge check sends after the drain window.

A canary is one short, non-streamed chat completion with a tight deadline: a wedged server
accepts the connection and then never answers, so only a real generation request tells a
serving server from one whose `/health` merely answers. Only a server that takes requests (a
router or a unified server, see roles.py) gets one.

What came back is told apart, because only one outcome is a sign of a wedge, and our own check
failing is never a verdict about the server:
- `ok`: a completion with choices;
- `timeout`: no answer within the deadline: the hang a wedge makes (`canary_timeout`);
- `error`: an answer that is no completion (an HTTP error status, HTML, non-JSON, no
  choices, a dropped connection): an error of the check, reported as what it is;
- `unreachable`: no connection at all.

check_canary returns a `CanaryResult` and check_health a `HealthResult` (what wedge.detect_wedge
reads), and neither raises for anything a server does. Their `as_dict()` is the record events.jsonl
keeps (`t_ns`, `endpoint`, `ok` / `status`, `latency_s`, `error`, plus `result`).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any

import anyio
import httpx

from .charset import response_text

CANARY_PROMPT = "Reply with the single word OK."

OK, TIMEOUT, ERROR, UNREACHABLE = "ok", "timeout", "error", "unreachable"
FAILING = "failing"  # a /health that answered, with a status other than 200


@dataclass
class CanaryResult:
    """One canary: when, where, and what came back."""

    t_ns: int
    endpoint: str
    result: str  # ok | timeout | error | unreachable
    latency_s: float
    error: str | None = None
    http_status: int | None = None

    @property
    def ok(self) -> bool:
        return self.result == OK

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, **asdict(self)}


@dataclass
class HealthResult:
    """One GET of /health or /health_generate."""

    t_ns: int
    endpoint: str
    result: str  # ok | failing | timeout | unreachable | error
    latency_s: float
    status: int | None = None  # the HTTP status; None when nothing answered
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _err(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:200]


def _one_line(text: str, limit: int = 120) -> str:
    return " ".join(text.split())[:limit]


def _snippet(r: httpx.Response) -> str:
    """What an error answer says, briefly: an OpenAI / SGLang error message, else its first text."""
    try:
        body = r.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        err = body.get("error")
        message = err.get("message") if isinstance(err, dict) else err if isinstance(err, str) else body.get("message")
        if isinstance(message, str) and message:
            return _one_line(message)
        return _one_line(json.dumps(body))
    content_type = r.headers.get("content-type", "").split(";")[0].strip()
    text = response_text(r)
    if "html" in content_type or text.lstrip().lower().startswith(("<!doctype html", "<html")):
        return "an HTML page"
    return _one_line(text) or "an empty body"


def judge_answer(r: httpx.Response) -> tuple[str, str | None]:
    """(result, error) for an answer that came back: `ok` only for a 200 carrying choices."""
    if r.status_code != 200:
        return ERROR, f"HTTP {r.status_code}: {_snippet(r)}"
    try:
        body = r.json()
    except ValueError:
        content_type = r.headers.get("content-type", "").split(";")[0].strip() or "no content type"
        return ERROR, f"HTTP 200 but not JSON ({content_type}): {_snippet(r)}"
    if not isinstance(body, dict) or not isinstance(body.get("choices"), list) or not body["choices"]:
        return ERROR, "HTTP 200 but no completion (no choices)"
    return OK, None


async def check_canary(client: httpx.AsyncClient, base_url: str, model: str | None,
                       timeout: float = 10.0) -> CanaryResult:
    """One max_tokens=4 chat completion against `base_url` (…/v1)."""
    t_ns = time.monotonic_ns()
    body = {"model": model or "default", "messages": [{"role": "user", "content": CANARY_PROMPT}],
            "max_tokens": 4, "temperature": 0, "stream": False}
    result, error, status = TIMEOUT, f"timeout after {timeout:g} s", None
    # httpx's timeout is per phase (connect, each read); a server that trickles bytes could
    # outlive it, so the whole request also runs under one wall-clock deadline.
    with anyio.move_on_after(timeout):
        try:
            r = await client.post(base_url.rstrip("/") + "/chat/completions", json=body, timeout=timeout)
            status = r.status_code
            result, error = judge_answer(r)
        except httpx.TimeoutException:
            pass  # no answer in time: the default above
        except httpx.ConnectError as e:
            result, error = UNREACHABLE, _err(e)
        except httpx.HTTPError as e:  # the server dropped or garbled the connection: it did answer
            result, error = ERROR, _err(e)
    return CanaryResult(t_ns, base_url, result, round((time.monotonic_ns() - t_ns) / 1e9, 3), error, status)


async def check_health(client: httpx.AsyncClient, root_url: str, path: str = "/health",
                       timeout: float = 5.0) -> HealthResult:
    """GET root_url + path."""
    t_ns = time.monotonic_ns()
    result, status, error = TIMEOUT, None, f"timeout after {timeout:g} s"
    with anyio.move_on_after(timeout):
        try:
            status = (await client.get(root_url.rstrip("/") + path, timeout=timeout)).status_code
            result, error = (OK, None) if status == 200 else (FAILING, None)
        except httpx.TimeoutException:
            pass
        except httpx.ConnectError as e:
            result, error = UNREACHABLE, _err(e)
        except httpx.HTTPError as e:
            result, error = ERROR, _err(e)
    return HealthResult(t_ns, root_url.rstrip("/") + path, result, round((time.monotonic_ns() - t_ns) / 1e9, 3),
                        status, error)
