"""Reading a server's stream under bounds (`StreamBounds`): SSE lines and events decoded as
httpx-sse's decoders do and refused before a line past its bound is ever held whole, and the raw
lines of a turn kept as evidence, head and tail, each line clipped. Everything a server sends
is bounded: a line or event, the tool calls of a turn, one call's arguments, the text of a
turn, the protocol errors noted, the raw lines kept. sse.py assembles what passes.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

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
    """Decoded stream text in, the `data` of each completed SSE event out, with the line and
    event bounds enforced before a line is ever held whole.

    NOTE: the reading is httpx-sse's (SSELineDecoder + SSEDecoder) to the letter, in one pass
    with no object per line or event, since it runs for every line a server sends: lines end at
    CRLF, CR or LF (a CR at the end of a piece waits for the next piece); a blank line
    dispatches the event when it has data, an event name, a retry or once any id was seen;
    `data:` lines join with LF; `:` lines are comments; one space after the colon is dropped.
    tests/test_sse.py holds it to httpx-sse's decoders on random streams. One thing more, as
    the SSE spec decodes a stream (and browsers read it): a byte order mark at its very start
    is dropped; httpx-sse would read `\ufeffdata: ...` as an unknown field and lose the event.
    """

    def __init__(self, bounds: StreamBounds = DEFAULT_BOUNDS) -> None:
        self.bounds = bounds
        self._buf = ""  # the line not yet ended
        self._cr = False  # the last piece ended in CR: its line ended, an LF may follow
        self._pending = 0  # characters of the line not yet ended, as counted for the bound
        self._event_chars = 0
        self._data: list[str] = []
        self._event = ""
        self._id = ""
        self._retry: int | None = None
        self._started = False  # some text came (a BOM is dropped only before it)

    def feed(self, text: str) -> list[str]:
        """The data of the events completed by `text`; raises BoundExceeded past a bound."""
        if not self._started and text:
            self._started = True
            text = text.removeprefix("\ufeff")
        piece = text
        if self._cr:
            piece, self._cr = "\r" + piece, False
        if piece.endswith("\r"):
            piece, self._cr = piece[:-1], True
        if "\r" in piece:
            piece = piece.replace("\r\n", "\n").replace("\r", "\n")
        lines = piece.split("\n") if piece else []
        if len(lines) > 1:
            lines[0] = self._buf + lines[0]
            self._buf = lines.pop()
            self._pending = len(self._buf)
        else:
            self._buf += piece
            self._pending += len(text)
            lines = []
        if self._pending > self.bounds.line_chars:
            head = self._buf[: self.bounds.raw_line_chars]
            self._buf = ""
            raise BoundExceeded(f"an SSE line longer than {self.bounds.line_chars:,} characters", head)
        return self._decode(lines) if lines else lines

    def flush(self) -> list[str]:
        """Events completed by a last line without a newline. As in httpx-sse (and the SSE
        spec), an event with no blank line after it is never dispatched."""
        if not self._buf and not self._cr:
            return []
        line, self._buf, self._cr = self._buf, "", False
        return self._decode([line])

    def _decode(self, lines: list[str]) -> list[str]:
        out = []
        b = self.bounds
        for line in lines:
            if not line:
                self._event_chars = 0
                if self._data or self._event or self._id or self._retry is not None:
                    out.append("\n".join(self._data))
                    self._data, self._event, self._retry = [], "", None
                continue
            if len(line) > b.line_chars:
                raise BoundExceeded(f"an SSE line longer than {b.line_chars:,} characters", line[: b.raw_line_chars])
            self._event_chars += len(line)
            if self._event_chars > b.event_chars:
                raise BoundExceeded(f"an SSE event longer than {b.event_chars:,} characters", line[: b.raw_line_chars])
            if line.startswith("data: "):
                self._data.append(line[6:])
            elif line[0] != ":":
                self._field(line)
        return out

    def _field(self, line: str) -> None:
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\0" not in value:
                self._id = value
        elif name == "retry":
            try:
                self._retry = int(value)
            except ValueError:
                pass


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

    def extend(self, lines: list[str]) -> None:
        """`add` each of `lines`; at once when they all fit in the head whole."""
        b = self.bounds
        total = sum(map(len, lines))
        if lines and self._head_chars + total <= b.raw_head_chars and max(map(len, lines)) <= b.raw_line_chars:
            self.out.extend(lines)
            self._head_chars += total
            return
        for line in lines:
            self.add(line)

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
