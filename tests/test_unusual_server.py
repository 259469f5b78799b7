"""Answers a real server may give that are odd at the HTTP layer (a redirect, a charset no text
is in), read from a raw server on loopback by both clients, `agents`' chat_turn and Locust
mode's: each is a verdict about the server, never a crash of the harness."""

from __future__ import annotations

import asyncio
import json
import socket
import threading

import anyio
import httpx
import pytest

from dsv4bench.servers import canary
from dsv4bench.wire.client import chat_turn
from dsv4bench.locust import turn as locust_turn
from dsv4bench.harness.config import RunConfig
from dsv4bench.harness.driver import make_client
from dsv4bench.history.records import ErrorKind, TurnStatus
from dsv4bench.wire.turn_answer import Deadlines, TurnOutcome

BODY = {"model": "m", "messages": [], "stream": True}


def _sse(text: str, finish: str | None = None) -> bytes:
    chunk = {"id": "r1", "model": "m", "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}
    return f"data: {json.dumps(chunk)}\n\n".encode()


ANSWER = _sse("Done.") + _sse("", "stop") + b"data: [DONE]\n\n"


def _answer(head: bytes, body: bytes) -> bytes:
    return head + b"\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body) + body


def _locust_turn(head: bytes, body: bytes) -> TurnOutcome:
    """Locust mode's chat_turn (httpx's own client) against a one-answer server on a thread."""
    srv = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            request = b""
            while b"\r\n\r\n" not in request:
                request += conn.recv(65536)
            conn.sendall(_answer(head, body))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{srv.getsockname()[1]}/v1/chat/completions"
    try:
        with httpx.Client() as client:
            return locust_turn.chat_turn(client, url, BODY, Deadlines(5, 5))
    finally:
        thread.join(5)
        srv.close()


def _turn(head: bytes, body: bytes) -> TurnOutcome:
    """chat_turn against a server that answers `head` (status line and headers) and `body`."""
    out: list[TurnOutcome] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await reader.readuntil(b"\r\n\r\n")
            length = next(
                (int(x.split(b":")[1]) for x in request.split(b"\r\n") if x.lower().startswith(b"content-length")), 0
            )
            await reader.readexactly(length)
            writer.write(_answer(head, body))
            await writer.drain()
        finally:
            writer.close()

    async def main() -> None:
        srv = await asyncio.start_server(handle, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"
        try:
            async with make_client(RunConfig(url=url + "/v1", concurrency=1)) as client:
                out.append(await chat_turn(client, url + "/v1/chat/completions", BODY, Deadlines(5, 5)))
        finally:
            srv.close()
            await srv.wait_closed()

    anyio.run(main)
    return out[0]


@pytest.mark.parametrize(
    "charset, body",
    [
        ("zlib", ANSWER),  # a codec of bytes to bytes: its decoder refuses errors="replace"
        ("rot13", ANSWER),  # a codec of str to str: its decoder refuses bytes
        ("utf-16", ANSWER),  # a text encoding, whose decoder raises on a body without a BOM
    ],
)
@pytest.mark.parametrize("turn", [_turn, _locust_turn], ids=["agents", "locust"])
def test_a_charset_that_cannot_decode_the_body_is_a_decoding_error_not_a_crash(turn, charset, body):
    out = turn(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=" + charset.encode(), body)
    assert out.status is TurnStatus.ERROR and out.error_kind is ErrorKind.CONNECTION_ERROR
    assert out.error.startswith(f"DecodingError: the body does not decode as charset {charset!r}")


@pytest.mark.parametrize("turn", [_turn, _locust_turn], ids=["agents", "locust"])
def test_a_redirect_is_an_http_error_that_names_where_not_a_broken_stream(turn):
    out = turn(
        b"HTTP/1.1 307 Temporary Redirect\r\ncontent-type: text/html\r\n"
        b"location: https://gateway.example/v1/chat/completions",
        b"<a href='...'>moved</a>",
    )
    assert out.status is TurnStatus.ERROR and out.error_kind is ErrorKind.HTTP_ERROR and out.response is None
    assert out.error == "HTTP 307: <a href='...'>moved</a> (Location: https://gateway.example/v1/chat/completions)"


@pytest.mark.parametrize("turn", [_turn, _locust_turn], ids=["agents", "locust"])
def test_an_upper_case_content_type_and_a_byte_order_mark_are_a_clean_stream(turn):
    out = turn(b"HTTP/1.1 200 OK\r\ncontent-type: Text/Event-Stream; charset=UTF-8", "\ufeff".encode() + ANSWER)
    assert out.status is TurnStatus.OK and out.response.protocol_errors == []
    assert out.response.content == "Done." and out.response.finish_reason == "stop"


@pytest.mark.parametrize("charset", ["zlib", "rot13", "utf-16"])
def test_a_canary_error_in_a_charset_no_text_is_in_is_still_that_error(charset):
    r = httpx.Response(503, headers={"content-type": f"text/plain; charset={charset}"}, content=b"overloaded")
    result, error = canary.judge_answer(r)
    assert result == canary.ERROR and error == "HTTP 503: overloaded"
