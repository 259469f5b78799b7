"""Reading a server's stream under bounds (`StreamBounds`): SSE lines and events decoded with
httpx-sse's decoders and refused before a line past its bound is ever held whole, and the raw
lines of a turn kept as evidence, head and tail, each line clipped. Everything a server sends
is bounded: a line or event, the tool calls of a turn, one call's arguments, the text of a
turn, the protocol errors noted, the raw lines kept. sse.py assembles what passes.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from httpx_sse import ServerSentEvent
from httpx_sse._decoders import SSEDecoder, SSELineDecoder

KIB = 1024
MIB = 1024 * KIB


@dataclass(frozen=True)
class StreamBounds:
    """What one turn may bring in before the harness stops reading (characters unless named)."""

    line_chars: int = 1 * MIB  # one SSE line
    event_chars: int = 1 * MIB  # the data of one event (all of its `data:` lines)
    tool_calls: int = 128  # tool calls in one turn
    argument_chars: int = 256 * KIB  # one tool call's arguments
    text_chars: int = 4 * MIB  # content + reasoning + all arguments of one turn
    body_bytes: int = 16 * MIB  # a non-streamed body
    error_body_bytes: int = 64 * KIB  # the body of an HTTP error answer
    protocol_errors: int = 64  # protocol errors noted one by one; the rest are counted
    raw_head_chars: int = 128 * KIB  # raw SSE text kept from the start of a stream...
    raw_tail_chars: int = 128 * KIB  # ... and from its end
    raw_line_chars: int = 16 * KIB  # one kept raw line


DEFAULT_BOUNDS = StreamBounds()


class BoundExceeded(Exception):
    """An SSE line or event passed its bound; `head` is the start of it, for evidence."""

    def __init__(self, detail: str, head: str) -> None:
        super().__init__(detail)
        self.detail = detail
        self.head = head


class SSEEventReader:
    """Decoded stream text in, SSE events out (httpx-sse's decoders), with the line and event
    bounds enforced before a line is ever held whole."""

    def __init__(self, bounds: StreamBounds = DEFAULT_BOUNDS) -> None:
        self.bounds = bounds
        self._lines = SSELineDecoder()
        self._events = SSEDecoder()
        self._pending = 0  # characters of the line not yet ended
        self._event_chars = 0

    def feed(self, text: str) -> list[ServerSentEvent]:
        """Events completed by `text`; raises BoundExceeded past a bound."""
        lines = self._lines.decode(text)
        if lines:
            self._pending = sum(len(b) for b in self._lines.buffer)  # at most the tail after the last newline
        else:
            self._pending += len(text)
        if self._pending > self.bounds.line_chars:
            head = "".join(self._lines.buffer)[: self.bounds.raw_line_chars]
            self._lines.buffer = []
            raise BoundExceeded(f"an SSE line longer than {self.bounds.line_chars:,} characters", head)
        return self._decode(lines)

    def flush(self) -> list[ServerSentEvent]:
        """Events completed by a last line without a newline. As in httpx-sse (and the SSE
        spec), an event with no blank line after it is never dispatched."""
        return self._decode(self._lines.flush())

    def _decode(self, lines: list[str]) -> list[ServerSentEvent]:
        out = []
        for line in lines:
            if len(line) > self.bounds.line_chars:
                raise BoundExceeded(f"an SSE line longer than {self.bounds.line_chars:,} characters",
                                    line[: self.bounds.raw_line_chars])
            self._event_chars = 0 if not line else self._event_chars + len(line)
            if self._event_chars > self.bounds.event_chars:
                raise BoundExceeded(f"an SSE event longer than {self.bounds.event_chars:,} characters",
                                    line[: self.bounds.raw_line_chars])
            event = self._events.decode(line)
            if event is not None:
                out.append(event)
        return out


class RawLines:
    """The raw SSE lines kept as evidence: every line up to `raw_head_chars`, then the last
    lines up to `raw_tail_chars`, each line clipped; `close()` writes the kept tail (after a
    line saying what was left out) into `out`, which holds the head meanwhile."""

    def __init__(self, out: list[str], bounds: StreamBounds = DEFAULT_BOUNDS) -> None:
        self.out = out
        self.bounds = bounds
        self._head_chars = 0
        self._tail: deque[str] = deque()
        self._tail_chars = 0
        self._dropped = 0
        self._dropped_chars = 0

    def add(self, line: str) -> None:
        b = self.bounds
        if len(line) > b.raw_line_chars:
            line = line[: b.raw_line_chars] + f"…[+{len(line) - b.raw_line_chars:,} chars]"
        if self._head_chars + len(line) <= b.raw_head_chars:
            self.out.append(line)
            self._head_chars += len(line)
            return
        self._tail.append(line)
        self._tail_chars += len(line)
        while self._tail_chars > b.raw_tail_chars and self._tail:
            gone = self._tail.popleft()
            self._tail_chars -= len(gone)
            self._dropped += 1
            self._dropped_chars += len(gone)

    def close(self) -> None:
        if self._dropped:
            self.out.append(f"… {self._dropped:,} lines ({self._dropped_chars:,} chars) not kept …")
        self.out.extend(self._tail)
        self._tail.clear()
        self._tail_chars = self._dropped = self._dropped_chars = 0


def clip_raw(text: str, bounds: StreamBounds = DEFAULT_BOUNDS) -> str:
    """A raw body kept as evidence: its head and tail when longer than the raw bounds."""
    head, tail = bounds.raw_head_chars, bounds.raw_tail_chars
    if len(text) <= head + tail:
        return text
    return f"{text[:head]}\n… ({len(text) - head - tail:,} chars not kept) …\n{text[-tail:]}"
