"""One chat-completions exchange over anyio + httpx: where `agents` touches the network for a
turn. Streams SSE, enforces the TTFT and total deadlines, and returns plain data; it never
raises for anything the server does. What the bytes become (timings, raw lines, the assembled
response, the error) is turn_answer.py's, which the Locust user's turn shares.

What it reads is bounded (stream_reader.StreamBounds): past a bound it stops reading, closes the
response and returns what it has, flagged, so no answer can take the harness's memory.
"""

from __future__ import annotations

import math
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any, cast

import anyio
import httpx

from dsv4bench.wire.charset import Charset
from dsv4bench.loop.lag_clock import LoopWatch
from dsv4bench.history.records import AssembledResponse
from dsv4bench.wire.stream_reader import DEFAULT_BOUNDS, StreamBounds
from dsv4bench.wire.transport import arrival_clock, body_bytes, first_token_read, unlink
from dsv4bench.wire.turn_answer import (
    Deadlines,
    StreamedAnswer,
    TurnOutcome,
    TurnProbe,
    encode_body,
    finish,
    is_event_stream,
    is_http_error,
    request_headers,
    take_completion,
    take_connection_error,
    take_http_error,
    take_not_a_stream,
    take_timeout,
)


async def chat_turn(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    deadlines: Deadlines,
    headers: dict[str, str] | None = None,
    probe: TurnProbe | None = None,
    bounds: StreamBounds = DEFAULT_BOUNDS,
    clock: LoopWatch | None = None,
) -> TurnOutcome:
    """POST `body` to `url` (a /chat/completions endpoint) and assemble the reply.

    Cancellation from outside (the nemesis) propagates: the caller records `killed`. With
    `clock`, the deadlines run on its listening clock: the harness's own stalls do not count.
    """
    out = TurnOutcome.starting()
    if probe is not None:
        probe.outcome = out
    stream = bool(body.get("stream"))
    # One cancel scope carries both deadlines: it starts at the TTFT deadline and is moved
    # to the total deadline once the first token arrives.
    first_s = min(deadlines.ttft_s, deadlines.total_s)
    with anyio.CancelScope(deadline=anyio.current_time() + first_s if clock is None else math.inf) as scope:
        if clock is None:
            total_deadline = anyio.current_time() + deadlines.total_s

            def at_first_token() -> None:
                scope.deadline = total_deadline
        else:
            watched = clock.deadline(scope, first_s)
            total_due = clock.listening_s() + deadlines.total_s

            def at_first_token() -> None:
                clock.move(watched, total_due)

        answered: httpx.Response | None = None
        try:
            async with client.stream("POST", url, content=encode_body(body), headers=request_headers(headers)) as resp:
                answered = resp
                out.timings.first_byte_ns = arrival_clock(resp)()
                out.http_status = resp.status_code
                if is_http_error(resp.status_code):
                    take_http_error(
                        out, resp.status_code, resp.headers, (await _read_body(resp, bounds.error_body_bytes))[0]
                    )
                elif stream and not is_event_stream(resp.headers):
                    take_not_a_stream(out, resp.headers, (await _read_body(resp, 4096))[0])
                elif stream:

                    def first_token() -> None:
                        first_token_read(resp)
                        at_first_token()

                    out.response = await _read_stream(resp, StreamedAnswer(out, probe, bounds, first_token))
                else:
                    raw, over = await _read_body(resp, bounds.body_bytes)
                    take_completion(out, raw, over, bounds)
                    if probe is not None:
                        probe.phase = "streaming"
                    at_first_token()
        except httpx.RequestError as e:  # transport failures, and bodies that do not decode (gzip)
            take_connection_error(out, e)
        finally:
            if clock is not None:
                clock.drop(watched)
            if answered is not None:
                unlink(answered)
    if scope.cancelled_caught:
        take_timeout(out, deadlines)
    return finish(out)


async def _read_body(resp: httpx.Response, limit: int) -> tuple[bytes, bool]:
    """At most `limit` bytes of the body, and whether there was more (then unread: the
    response is closed, not drained)."""
    buf = bytearray()
    async for piece in resp.aiter_bytes():
        buf += piece
        if len(buf) > limit:
            return bytes(buf[:limit]), True
    return bytes(buf), False


async def _texts(resp: httpx.Response) -> AsyncGenerator[str, None]:
    """The body as text, as httpx's aiter_text gives it (the response's charset, undecodable
    bytes replaced), straight from the transport where it can (transport.body_bytes); where
    httpx must undo a content-encoding, from its decoded bytes."""
    charset = Charset(resp.encoding)
    reads = body_bytes(resp)
    if reads is None:
        # An async generator (httpx writes it as one), which httpx's signature calls an iterator.
        reads = cast("AsyncGenerator[bytes, None]", resp.aiter_bytes())
    async with aclosing(reads):
        async for data in reads:
            if text := charset.decode(data):
                yield text
    if text := charset.decode(b"", True):
        yield text


async def _read_stream(resp: httpx.Response, answer: StreamedAnswer) -> AssembledResponse:
    arrived = arrival_clock(resp)  # tokens are stamped when their bytes arrived, not when parsed
    try:
        async with aclosing(_texts(resp)) as texts:
            async for text in texts:
                if not answer.feed(text, arrived()):
                    break
            else:
                answer.end_of_body()
    except httpx.RequestError:
        if not answer.any_output:
            raise
        # A stream the server cut after some output is a truncated response, not a
        # connection failure: what arrived is the finding, and the checkers judge it.
    finally:
        answer.close()  # also when cancelled: a killed turn keeps its raw lines
    return answer.finish()
