"""One chat-completions exchange on gevent: the Locust user's twin of client.chat_turn, with the
same reading of the answer (turn_answer.py) and the same deadlines, over httpx's blocking
client, which gevent's monkey-patching makes cooperative.

A Locust user stopped abruptly (a kill-storm shape, a stop in the web UI) gets GreenletExit
here, mid-read: the `with` closes the response, so the server sees the connection drop as a
killed agent's, and the exception goes on up to the user, which records the turn killed.
"""

from __future__ import annotations

import time
from typing import Any

import gevent
import httpx

from dsv4bench.wire.charset import Charset
from dsv4bench.history.records import AssembledResponse
from dsv4bench.wire.stream_reader import DEFAULT_BOUNDS, StreamBounds
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


class _DeadlinePassed(Exception):
    """Raised into the turn's greenlet by its gevent.Timeout."""


def chat_turn(
    client: httpx.Client,
    url: str,
    body: dict[str, Any],
    deadlines: Deadlines,
    headers: dict[str, str] | None = None,
    probe: TurnProbe | None = None,
    bounds: StreamBounds = DEFAULT_BOUNDS,
) -> TurnOutcome:
    """POST `body` to `url` (a /chat/completions endpoint) and assemble the reply."""
    out = TurnOutcome.starting()
    if probe is not None:
        probe.outcome = out
    stream = bool(body.get("stream"))
    # NOTE: two timers, as one cancel scope moved from the TTFT to the total deadline in client.py:
    # the TTFT one is cancelled at the first token.
    total = gevent.Timeout(deadlines.total_s, _DeadlinePassed)
    ttft = gevent.Timeout(min(deadlines.ttft_s, deadlines.total_s), _DeadlinePassed)
    total.start()
    ttft.start()
    try:
        with client.stream("POST", url, content=encode_body(body), headers=request_headers(headers)) as resp:
            out.timings.first_byte_ns = time.monotonic_ns()
            out.http_status = resp.status_code
            if is_http_error(resp.status_code):
                take_http_error(out, resp.status_code, resp.headers, _read_body(resp, bounds.error_body_bytes)[0])
            elif stream and not is_event_stream(resp.headers):
                take_not_a_stream(out, resp.headers, _read_body(resp, 4096)[0])
            elif stream:
                out.response = _read_stream(resp, StreamedAnswer(out, probe, bounds, ttft.cancel))
            else:
                raw, over = _read_body(resp, bounds.body_bytes)
                ttft.cancel()
                take_completion(out, raw, over, bounds)
                if probe is not None:
                    probe.phase = "streaming"
    except _DeadlinePassed:
        take_timeout(out, deadlines)
    except httpx.RequestError as e:  # transport failures, and bodies that do not decode (gzip)
        take_connection_error(out, e)
    finally:
        ttft.close()
        total.close()
    return finish(out)


def _read_body(resp: httpx.Response, limit: int) -> tuple[bytes, bool]:
    """At most `limit` bytes of the body, and whether there was more (then unread)."""
    buf = bytearray()
    for piece in resp.iter_bytes():
        buf += piece
        if len(buf) > limit:
            return bytes(buf[:limit]), True
    return bytes(buf), False


def _read_stream(resp: httpx.Response, answer: StreamedAnswer) -> AssembledResponse:
    try:
        charset = Charset(resp.encoding)
        for data in resp.iter_bytes():
            if (text := charset.decode(data)) and not answer.feed(text):
                break
        else:
            tail = charset.decode(b"", True)
            if not tail or answer.feed(tail):
                answer.end_of_body()
    except httpx.RequestError:
        if not answer.any_output:
            raise
        # A stream cut after some output is a truncated response: the checkers judge it.
    finally:
        answer.close()  # also when the user is stopped mid-read: a killed turn keeps its raw lines
    return answer.finish()
