"""One chat-completions exchange over httpx: the only place the harness touches the network
for a turn. Streams SSE, stamps timings, enforces the TTFT and total deadlines, and returns
plain data; it never raises for anything the server does.

What it reads is bounded (stream_reader.StreamBounds): past a bound it stops reading, closes the
response and returns what it has, flagged, so no answer can take the harness's memory.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx

from .records import AssembledResponse, ErrorKind, Timings, TurnStatus
from .sse import DeltaAssembler, assemble_completion, replace_surrogates
from .stream_reader import DEFAULT_BOUNDS, BoundExceeded, RawLines, SSEEventReader, StreamBounds, clip_raw

# Inter-token gaps kept per turn: enough for any max_tokens a user sets, bounded for a server
# that streams tokens forever.
MAX_TOKEN_GAPS = 65_536


@dataclass
class TurnOutcome:
    """What came back for one request, before any checker looked at it."""

    status: TurnStatus
    timings: Timings
    response: AssembledResponse | None = None
    http_status: int | None = None
    error: str | None = None
    error_kind: ErrorKind | None = None
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
    bounds: StreamBounds = DEFAULT_BOUNDS,
) -> TurnOutcome:
    """POST `body` to `url` (a /chat/completions endpoint) and assemble the reply.

    Cancellation from outside (the nemesis) propagates: the caller records `killed`.
    """
    t = Timings(start_wall_ns=time.time_ns(), start_ns=time.monotonic_ns())
    out = TurnOutcome(status=TurnStatus.OK, timings=t)
    if probe is not None:
        probe.outcome = out
    stream = bool(body.get("stream"))
    request_headers = {"Content-Type": "application/json", **(headers or {})}
    # One cancel scope carries both deadlines: it starts at the TTFT deadline and is moved
    # to the total deadline once the first token arrives.
    with anyio.CancelScope(deadline=anyio.current_time() + min(deadlines.ttft_s, deadlines.total_s)) as scope:
        total_deadline = anyio.current_time() + deadlines.total_s
        try:
            async with client.stream("POST", url, content=encode_body(body), headers=request_headers) as resp:
                t.first_byte_ns = time.monotonic_ns()
                out.http_status = resp.status_code
                if resp.status_code >= 400:
                    raw, _ = await _read_body(resp, bounds.error_body_bytes)
                    text = raw.decode("utf-8", "replace")
                    out.status, out.error_kind = TurnStatus.ERROR, ErrorKind.HTTP_ERROR
                    out.error = f"HTTP {resp.status_code}: {_error_message(text)}{_retry_after(resp)}"
                    out.raw_lines = [text[:4000]]
                elif stream and not _is_event_stream(resp):
                    raw, _ = await _read_body(resp, 4096)
                    content_type = resp.headers.get("content-type", "")
                    out.response = AssembledResponse(
                        stream=True, protocol_errors=[f"not an SSE stream: Content-Type {content_type[:80]!r}"])
                    out.raw_lines = [raw.decode("utf-8", "replace")]
                elif stream:
                    out.response = await _read_stream(resp, t, out.raw_lines, scope, total_deadline, probe, bounds)
                else:
                    raw, over = await _read_body(resp, bounds.body_bytes)
                    t.first_token_ns = time.monotonic_ns()
                    if probe is not None:
                        probe.phase = "streaming"
                    scope.deadline = total_deadline
                    out.response = _read_completion(raw, over, bounds)
                    out.raw_lines = [clip_raw(raw.decode("utf-8", "replace"), bounds)]
        except httpx.RequestError as e:  # transport failures, and bodies that do not decode (gzip)
            out.status, out.error_kind = TurnStatus.ERROR, ErrorKind.CONNECTION_ERROR
            out.error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    if scope.cancelled_caught:
        out.status = TurnStatus.TIMEOUT
        if t.first_token_ns is None:
            out.error_kind, out.error = ErrorKind.TIMEOUT_TTFT, f"no first token within {deadlines.ttft_s:g} s"
        else:
            out.error_kind, out.error = ErrorKind.TIMEOUT_TOTAL, f"not finished within {deadlines.total_s:g} s"
        out.response = None
    if out.error is not None:
        out.error = replace_surrogates(out.error)[0]
    t.end_ns = time.monotonic_ns()
    return out


def encode_body(body: dict[str, Any]) -> bytes:
    """The request as JSON bytes (what httpx's `json=` sends), with ASCII escapes where the text
    holds something UTF-8 cannot encode, so no request built from a server's reply can fail."""
    try:
        return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(body, ensure_ascii=True, separators=(",", ":"), allow_nan=False).encode("ascii")


def _is_event_stream(resp: httpx.Response) -> bool:
    return "text/event-stream" in resp.headers.get("content-type", "").partition(";")[0]


def _retry_after(resp: httpx.Response) -> str:
    value = resp.headers.get("retry-after")
    return f" (Retry-After: {value[:40]})" if value else ""


async def _read_body(resp: httpx.Response, limit: int) -> tuple[bytes, bool]:
    """At most `limit` bytes of the body, and whether there was more (then unread: the
    response is closed, not drained)."""
    buf = bytearray()
    async for piece in resp.aiter_bytes():
        buf += piece
        if len(buf) > limit:
            return bytes(buf[:limit]), True
    return bytes(buf), False


def _read_completion(raw: bytes, over: bool, bounds: StreamBounds) -> AssembledResponse:
    """A non-streamed body: assembled, or the reason it could not be."""
    if over:
        detail = f"a response body larger than {bounds.body_bytes:,} bytes"
        return AssembledResponse(stream=False, stopped_at_bound=detail,
                                 protocol_errors=[f"the harness stopped reading: {detail}"])
    try:
        parsed = json.loads(raw.decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        return AssembledResponse(stream=False, protocol_errors=["response body is not JSON"])
    return assemble_completion(parsed, bounds)


async def _read_stream(
    resp: httpx.Response,
    t: Timings,
    raw_lines: list[str],
    scope: anyio.CancelScope,
    total_deadline: float,
    probe: TurnProbe | None = None,
    bounds: StreamBounds = DEFAULT_BOUNDS,
) -> AssembledResponse:
    asm = DeltaAssembler(bounds)
    if probe is not None:
        probe.assembler = asm
    reader = SSEEventReader(bounds)
    raw = RawLines(raw_lines, bounds)
    last_token_ns: int | None = None
    try:
        async for text in resp.aiter_text():
            try:
                events = reader.feed(text)
            except BoundExceeded as e:
                raw.add(e.head + "…")
                asm.stop(e.detail)
                break
            for event in events:
                raw.add(event.data)
                if probe is not None and probe.phase != "toolcall" and '"tool_calls"' in event.data:
                    probe.phase = "toolcall"  # cheap: only the nemesis's who=toolcall reads it
                if asm.feed(event.data):
                    now = time.monotonic_ns()
                    if t.first_token_ns is None:
                        t.first_token_ns = now
                        scope.deadline = total_deadline
                        if probe is not None and probe.phase == "waiting":
                            probe.phase = "streaming"
                    elif last_token_ns is not None and len(t.token_gaps_ms) < MAX_TOKEN_GAPS:
                        t.token_gaps_ms.append((now - last_token_ns) / 1e6)
                    last_token_ns = now
                if asm.stopped:
                    break
            if asm.stopped:
                break
        else:
            try:
                for event in reader.flush():
                    raw.add(event.data)
                    asm.feed(event.data)
            except BoundExceeded as e:
                raw.add(e.head + "…")
                asm.stop(e.detail)
    except httpx.RequestError:
        if asm.response.chunks == 0:
            raise
        # A stream the server cut after some output is a truncated response, not a
        # connection failure: what arrived is the finding, and the checkers judge it.
    finally:
        raw.close()
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
    except (ValueError, RecursionError):
        pass
    return text.strip().splitlines()[0][:300] if text.strip() else "(empty body)"
