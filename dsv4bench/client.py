"""One chat-completions exchange over httpx: the only place the harness touches the network
for a turn. Streams SSE, stamps timings, enforces the TTFT and total deadlines, and returns
plain data; it never raises for anything the server does.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
from httpx_sse import EventSource, SSEError

from .records import AssembledResponse, Timings, TurnStatus
from .sse import DeltaAssembler, assemble_completion


@dataclass
class TurnOutcome:
    """What came back for one request, before any checker looked at it."""

    status: TurnStatus
    timings: Timings
    response: AssembledResponse | None = None
    http_status: int | None = None
    error: str | None = None
    error_kind: str | None = None  # http_error | timeout_ttft | timeout_total | connection_error
    raw_lines: list[str] = field(default_factory=list)


@dataclass
class TurnProbe:
    """What the nemesis may read of a turn in flight (the driver passes one to chat_turn).

    `phase`: "waiting" until the first token, "streaming" after it, "toolcall" once a
    tool-call delta arrived. `outcome` is the turn's outcome object as it fills up, so a turn
    cancelled from outside keeps its timings and raw lines; `assembler` its partial response.
    """

    phase: str = "waiting"
    outcome: TurnOutcome | None = None
    assembler: DeltaAssembler | None = None


@dataclass(frozen=True)
class Deadlines:
    """Seconds from the start of a request to its first token, and to its end."""

    ttft_s: float = 60.0
    total_s: float = 300.0


async def chat_turn(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    deadlines: Deadlines,
    headers: dict[str, str] | None = None,
    probe: TurnProbe | None = None,
) -> TurnOutcome:
    """POST `body` to `url` (a /chat/completions endpoint) and assemble the reply.

    Cancellation from outside (the nemesis) propagates: the caller records `killed`.
    """
    t = Timings(start_wall_ns=time.time_ns(), start_ns=time.monotonic_ns())
    out = TurnOutcome(status=TurnStatus.OK, timings=t)
    if probe is not None:
        probe.outcome = out
    stream = bool(body.get("stream"))
    # One cancel scope carries both deadlines: it starts at the TTFT deadline and is moved
    # to the total deadline once the first token arrives.
    with anyio.CancelScope(deadline=anyio.current_time() + min(deadlines.ttft_s, deadlines.total_s)) as scope:
        total_deadline = anyio.current_time() + deadlines.total_s
        try:
            async with client.stream("POST", url, json=body, headers=headers) as resp:
                t.first_byte_ns = time.monotonic_ns()
                out.http_status = resp.status_code
                if resp.status_code >= 400:
                    text = (await resp.aread()).decode("utf-8", "replace")
                    out.status, out.error_kind = TurnStatus.ERROR, "http_error"
                    out.error = f"HTTP {resp.status_code}: {_error_message(text)}"
                    out.raw_lines = [text[:4000]]
                elif stream:
                    out.response = await _read_stream(resp, t, out.raw_lines, scope, total_deadline, probe)
                else:
                    raw = await resp.aread()
                    t.first_token_ns = time.monotonic_ns()
                    if probe is not None:
                        probe.phase = "streaming"
                    scope.deadline = total_deadline
                    text = raw.decode("utf-8", "replace")
                    out.raw_lines = [text]
                    try:
                        out.response = assemble_completion(json.loads(text))
                    except ValueError:
                        out.response = AssembledResponse(stream=False, protocol_errors=["response body is not JSON"])
        except httpx.TransportError as e:
            out.status, out.error_kind = TurnStatus.ERROR, "connection_error"
            out.error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        except SSEError as e:  # 200 but not text/event-stream
            out.response = AssembledResponse(stream=True, protocol_errors=[f"not an SSE stream: {e}"])
    if scope.cancelled_caught:
        out.status = TurnStatus.TIMEOUT
        if t.first_token_ns is None:
            out.error_kind, out.error = "timeout_ttft", f"no first token within {deadlines.ttft_s:g} s"
        else:
            out.error_kind, out.error = "timeout_total", f"not finished within {deadlines.total_s:g} s"
        out.response = None
    t.end_ns = time.monotonic_ns()
    return out


async def _read_stream(
    resp: httpx.Response,
    t: Timings,
    raw_lines: list[str],
    scope: anyio.CancelScope,
    total_deadline: float,
    probe: TurnProbe | None = None,
) -> AssembledResponse:
    asm = DeltaAssembler()
    if probe is not None:
        probe.assembler = asm
    last_token_ns: int | None = None
    try:
        async for event in EventSource(resp).aiter_sse():
            raw_lines.append(event.data)
            if probe is not None and probe.phase != "toolcall" and '"tool_calls"' in event.data:
                probe.phase = "toolcall"  # cheap: only the nemesis's who=toolcall reads it
            if asm.feed(event.data):
                now = time.monotonic_ns()
                if t.first_token_ns is None:
                    t.first_token_ns = now
                    scope.deadline = total_deadline
                    if probe is not None and probe.phase == "waiting":
                        probe.phase = "streaming"
                elif last_token_ns is not None:
                    t.token_gaps_ms.append((now - last_token_ns) / 1e6)
                last_token_ns = now
    except httpx.TransportError:
        if asm.response.chunks == 0:
            raise
        # A stream the server cut after some output is a truncated response, not a
        # connection failure: what arrived is the finding, and the checkers judge it.
    return asm.finish()


def _error_message(text: str) -> str:
    """The `message` of an OpenAI-style error body, or the body's first line."""
    try:
        body = json.loads(text)
        err = body.get("error", body) if isinstance(body, dict) else body
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:300]
        if isinstance(body, dict) and body.get("detail"):
            return str(body["detail"])[:300]
    except ValueError:
        pass
    return text.strip().splitlines()[0][:300] if text.strip() else "(empty body)"
