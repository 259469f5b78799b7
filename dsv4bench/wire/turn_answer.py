"""One turn's exchange without the I/O: the request's bytes, and what the answer's bytes become
(timings, raw lines kept as evidence, the assembled response, or the error it was), whichever
I/O reads them: client.py's anyio + httpx for `agents`, the Locust user's gevent + httpx
(locust/turn.py). Both read an answer the same way because they share everything here.

What it takes in is bounded (stream_reader.StreamBounds); it never raises for anything the
server sends.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from dsv4bench.history.records import AssembledResponse, ErrorKind, Timings, TurnStatus
from dsv4bench.wire.sse import DeltaAssembler, assemble_completion, replace_surrogates
from dsv4bench.wire.stream_reader import DEFAULT_BOUNDS, BoundExceeded, RawLines, SSEEventReader, StreamBounds, clip_raw

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

    @classmethod
    def starting(cls) -> TurnOutcome:
        """An outcome whose clock starts now."""
        return cls(status=TurnStatus.OK, timings=Timings(start_wall_ns=time.time_ns(), start_ns=time.monotonic_ns()))


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


# ---- the request ----------------------------------------------------------------------------------


def encode_body(body: dict[str, Any]) -> bytes:
    """The request as JSON bytes (what httpx's `json=` sends), with ASCII escapes where the text
    holds something UTF-8 cannot encode, so no request built from a server's reply can fail. A
    float JSON cannot hold (NaN, infinity: only a replayed capture can carry one) is sent as
    null, as JavaScript's JSON.stringify writes it."""
    # NOTE: msgspec: a late turn's transcript takes json.dumps some 10x longer. What msgspec
    # refuses (a lone surrogate, a type it does not know) goes to json.
    try:
        return _ENCODE(body)
    except (UnicodeEncodeError, TypeError, OverflowError, ValueError):
        pass
    try:
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(body, ensure_ascii=True, separators=(",", ":")).encode("ascii")


_ENCODE = msgspec.json.Encoder().encode


def request_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    return {"Content-Type": "application/json", **(headers or {})}


# ---- the answer -----------------------------------------------------------------------------------


def is_event_stream(headers: Mapping[str, str]) -> bool:
    """Whether the Content-Type is SSE's (a media type is case-insensitive: `Text/Event-Stream` is one)."""
    return "text/event-stream" in headers.get("content-type", "").partition(";")[0].lower()


def is_http_error(status: int) -> bool:
    """Whether an answer's status makes the turn an http_error. A redirect is one: no chat
    answer came, and the harness follows none (the URL to fix is the user's)."""
    return status >= 300


def take_http_error(out: TurnOutcome, status: int, headers: Mapping[str, str], raw: bytes) -> None:
    """An answer whose status is_http_error (`raw`: the head of its body)."""
    text = raw.decode("utf-8", "replace")
    out.status, out.error_kind = TurnStatus.ERROR, ErrorKind.HTTP_ERROR
    noted = "".join(
        f" ({name}: {value[:limit]})"
        for name, limit in (("Retry-After", 40), ("Location", 200))
        if (value := headers.get(name))
    )
    out.error = f"HTTP {status}: {_error_message(text)}{noted}"
    out.raw_lines = [text[:4000]]


def take_not_a_stream(out: TurnOutcome, headers: Mapping[str, str], raw: bytes) -> None:
    """A streamed request answered with something that is no SSE stream (`raw`: its head)."""
    content_type = headers.get("content-type", "")
    out.response = AssembledResponse(
        stream=True, protocol_errors=[f"not an SSE stream: Content-Type {content_type[:80]!r}"]
    )
    out.raw_lines = [raw.decode("utf-8", "replace")]


def take_completion(out: TurnOutcome, raw: bytes, over: bool, bounds: StreamBounds = DEFAULT_BOUNDS) -> None:
    """A non-streamed body, `over` when it was longer than bounds.body_bytes (then `raw` is its head)."""
    out.timings.first_token_ns = time.monotonic_ns()
    if over:
        detail = f"a response body larger than {bounds.body_bytes:,} bytes"
        out.response = AssembledResponse(
            stream=False, stopped_at_bound=detail, protocol_errors=[f"the harness stopped reading: {detail}"]
        )
    else:
        try:
            parsed = json.loads(raw.decode("utf-8", "replace"))
        except (ValueError, RecursionError):
            out.response = AssembledResponse(stream=False, protocol_errors=["response body is not JSON"])
        else:
            out.response = assemble_completion(parsed, bounds)
    out.raw_lines = [clip_raw(raw.decode("utf-8", "replace"), bounds)]


def take_connection_error(out: TurnOutcome, e: BaseException) -> None:
    """The transport failed (or a body did not decode): no answer to judge."""
    out.status, out.error_kind = TurnStatus.ERROR, ErrorKind.CONNECTION_ERROR
    out.error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def take_timeout(out: TurnOutcome, deadlines: Deadlines) -> None:
    """A deadline passed: the TTFT one when no token had come, else the total one."""
    out.status = TurnStatus.TIMEOUT
    if out.timings.first_token_ns is None:
        out.error_kind, out.error = ErrorKind.TIMEOUT_TTFT, f"no first token within {deadlines.ttft_s:g} s"
    else:
        out.error_kind, out.error = ErrorKind.TIMEOUT_TOTAL, f"not finished within {deadlines.total_s:g} s"
    out.response = None


def finish(out: TurnOutcome) -> TurnOutcome:
    """Stamp the end; the error text made encodable."""
    if out.error is not None:
        out.error = replace_surrogates(out.error)[0]
    out.timings.end_ns = time.monotonic_ns()
    return out


class StreamedAnswer:
    """An SSE answer as its text arrives: events decoded under the bounds, raw lines kept, deltas
    assembled, the first token and the gaps between tokens stamped. `on_first_token` runs once,
    when the first token arrives (where the reader moves from the TTFT to the total deadline)."""

    def __init__(
        self,
        out: TurnOutcome,
        probe: TurnProbe | None = None,
        bounds: StreamBounds = DEFAULT_BOUNDS,
        on_first_token: Callable[[], None] | None = None,
    ) -> None:
        self.t = out.timings
        self.asm = DeltaAssembler(bounds)
        self.reader = SSEEventReader(bounds)
        self.raw = RawLines(out.raw_lines, bounds)
        self.probe = probe
        self.on_first_token = on_first_token
        self._last_token_ns: int | None = None
        if probe is not None:
            probe.assembler = self.asm

    def feed(self, text: str, arrived_ns: int | None = None) -> bool:
        """The next piece of the body, which arrived at `arrived_ns` (CLOCK_MONOTONIC; now when
        not given); False once nothing more must be read (a bound, or the end)."""
        try:
            events = self.reader.feed(text)
        except BoundExceeded as e:
            self.raw.add(e.head + "…")
            self.asm.stop(e.detail)
            return False
        probe, asm, t = self.probe, self.asm, self.t
        # NOTE: the events' raw lines are kept after the loop, up to the one the assembler stopped
        # at: the same lines as one by one, since nothing can read them while the loop runs.
        for n, data in enumerate(events, 1):
            if probe is not None and probe.phase != "toolcall" and '"tool_calls"' in data:
                probe.phase = "toolcall"  # cheap: only the nemesis's who=toolcall reads it
            if asm.feed(data):
                now = arrived_ns or time.monotonic_ns()
                if t.first_token_ns is None:
                    t.first_token_ns = now
                    if self.on_first_token is not None:
                        self.on_first_token()
                    if probe is not None and probe.phase == "waiting":
                        probe.phase = "streaming"
                elif self._last_token_ns is not None and len(t.token_gaps_ms) < MAX_TOKEN_GAPS:
                    t.token_gaps_ms.append((now - self._last_token_ns) / 1e6)
                self._last_token_ns = now
            if asm.response.stopped_at_bound is not None:
                self.raw.extend(events[:n])
                return False
        self.raw.extend(events)
        return True

    def end_of_body(self) -> None:
        """The body ended: what the decoder still holds is the last event."""
        try:
            for data in self.reader.flush():
                self.raw.add(data)
                self.asm.feed(data)
        except BoundExceeded as e:
            self.raw.add(e.head + "…")
            self.asm.stop(e.detail)

    @property
    def any_output(self) -> bool:
        """Whether a chunk came: a stream cut after one is a truncated answer, not a failed connection."""
        return self.asm.response.chunks > 0

    def close(self) -> None:
        """No more text will come: the raw lines' kept tail joins their head."""
        self.raw.close()

    def finish(self) -> AssembledResponse:
        self.close()
        return self.asm.finish()


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
