"""Canary and /health probes: the small requests a wedge check sends after the drain window.

A canary is one short chat completion with a tight deadline: a wedged server accepts the
connection and then never answers, so only a real generation request tells a serving server
from one whose `/health` merely answers. Only a server that takes requests (a router or a
unified server, see roles.py) gets one; it is sent twice, not streamed and streamed, because
a server can wedge in one path only: a stream that sends its headers, even a first chunk,
and then never another byte is as hung as a request that gets no answer, and the whole
stream, to its end, must come within the same deadline.

What came back is told apart, because only one outcome is a sign of a wedge, and our own check
failing is never a verdict about the server:
- `ok`: a completion with choices;
- `timeout`: no answer within the deadline, or a stream not ended by it: the hang a wedge
  makes (`canary_timeout`);
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

from dsv4bench.wire.charset import response_text
from dsv4bench.servers.kinds import NOT_THERE

CANARY_PROMPT = "Reply with the single word OK."

OK, TIMEOUT, ERROR, UNREACHABLE = "ok", "timeout", "error", "unreachable"
FAILING = "failing"  # a /health that answered, with a status other than 200
# An endpoint the server does not offer (servers/kinds.py): not asked, or answered 404 / 405 /
# 501 where its kind may lack it. Never a sign that the server is unwell.
NOT_OFFERED = "not_offered"


@dataclass
class CanaryResult:
    """One canary: when, where, and what came back."""

    t_ns: int
    endpoint: str
    result: str  # ok | timeout | error | unreachable
    latency_s: float
    error: str | None = None
    http_status: int | None = None
    stream: bool = False  # sent streamed
    # Streamed: seconds to the first chunk of the answer; None when none came.
    first_chunk_s: float | None = None

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
    result: str  # ok | failing | timeout | unreachable | error | not_offered
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


async def check_canary(
    client: httpx.AsyncClient, base_url: str, model: str | None, timeout: float = 10.0, stream: bool = False
) -> CanaryResult:
    """One max_tokens=4 chat completion against `base_url` (…/v1), streamed or not."""
    t_ns = time.monotonic_ns()
    body = {
        "model": model or "default",
        "messages": [{"role": "user", "content": CANARY_PROMPT}],
        "max_tokens": 4,
        "temperature": 0,
        "stream": stream,
    }
    error: str | None
    result, error, status = TIMEOUT, f"timeout after {timeout:g} s", None
    first: list[float] = []  # the streamed answer's first chunk, seconds after the request
    # httpx's timeout is per phase (connect, each read); a server that trickles bytes could
    # outlive it, so the whole request also runs under one wall-clock deadline.
    with anyio.move_on_after(timeout):
        try:
            url = base_url.rstrip("/") + "/chat/completions"
            if stream:
                async with client.stream("POST", url, json=body, timeout=timeout) as r:
                    status = r.status_code
                    result, error = await _read_stream(r, t_ns, first)
            else:
                r = await client.post(url, json=body, timeout=timeout)
                status = r.status_code
                result, error = judge_answer(r)
        except httpx.TimeoutException:
            pass  # no answer in time: the default above
        except httpx.ConnectError as e:
            result, error = UNREACHABLE, _err(e)
        except httpx.HTTPError as e:  # the server dropped or garbled the connection: it did answer
            result, error = ERROR, _err(e)
    first_s = round(first[0], 3) if first else None
    if result == TIMEOUT and stream and status is not None:
        # Headers came, maybe a first chunk: the stream stalled, the hang a wedge makes all the same.
        after = f"its first chunk at {first_s:g} s" if first_s is not None else f"HTTP {status} headers"
        error = f"stream stalled after {after}, not ended in {timeout:g} s"
    return CanaryResult(
        t_ns, base_url, result, round((time.monotonic_ns() - t_ns) / 1e9, 3), error, status, stream, first_s
    )


async def _read_stream(r: httpx.Response, t_ns: int, first: list[float]) -> tuple[str, str | None]:
    """(result, error) of a streamed answer read to its end: `ok` for a 200 event stream that
    carried at least one chunk with choices and ended ([DONE] or the body's end)."""
    content_type = r.headers.get("content-type", "").split(";")[0].strip()
    if r.status_code != 200 or content_type != "text/event-stream":
        # An error, or an answer that is no event stream (one whole completion from a server
        # that does not stream, an HTML page): judged as the unstreamed canary's answer is.
        await r.aread()
        return judge_answer(r)
    chunks = 0
    async for line in r.aiter_lines():
        if not first:
            first.append((time.monotonic_ns() - t_ns) / 1e9)
        line = line.strip()
        if not line.startswith("data:"):
            continue
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            break
        try:
            chunk = json.loads(data)
        except ValueError:
            return ERROR, f"HTTP 200 stream with a data line that is not JSON: {_one_line(data, 60)}"
        if isinstance(chunk, dict) and isinstance(chunk.get("choices"), list) and chunk["choices"]:
            chunks += 1
        elif isinstance(chunk, dict) and "error" in chunk:
            return ERROR, f"HTTP 200 stream carrying an error: {_one_line(json.dumps(chunk['error']))}"
    if chunks == 0:
        what = "an event stream" if content_type == "text/event-stream" else content_type or "no content type"
        return ERROR, f"HTTP 200 but no completion chunk ({what})"
    return OK, None


async def check_health(
    client: httpx.AsyncClient, root_url: str, path: str = "/health", timeout: float = 5.0, offered: bool | None = True
) -> HealthResult:
    """GET root_url + path. `offered` (server_kinds.Kind.offered): False, the server's kind never
    had it, so it is not asked; None, its kind may lack it, so a 404, 405 or 501 is `not_offered`;
    True, every answer but 200 is `failing`."""
    t_ns = time.monotonic_ns()
    if offered is False:
        return HealthResult(
            t_ns, root_url.rstrip("/") + path, NOT_OFFERED, 0.0, error="not offered by this kind of server"
        )
    error: str | None
    result, status, error = TIMEOUT, None, f"timeout after {timeout:g} s"
    with anyio.move_on_after(timeout):
        try:
            status = (await client.get(root_url.rstrip("/") + path, timeout=timeout)).status_code
            if status == 200:
                result, error = OK, None
            elif offered is None and status in NOT_THERE:
                result, error = NOT_OFFERED, f"HTTP {status}: not offered"
            else:
                result, error = FAILING, None
        except httpx.TimeoutException:
            pass
        except httpx.ConnectError as e:
            result, error = UNREACHABLE, _err(e)
        except httpx.HTTPError as e:
            result, error = ERROR, _err(e)
    return HealthResult(
        t_ns, root_url.rstrip("/") + path, result, round((time.monotonic_ns() - t_ns) / 1e9, 3), status, error
    )
