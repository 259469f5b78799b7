"""The aiohttp transport under `agents`' httpx client: chat_turn over it reads answers, keeps
its bounds, its deadlines and its error classes, and a cut-short read drops the connection,
as over httpcore. A raw asyncio server on loopback answers each request in the way its path names."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import anyio
import httpx
import pytest

from dsv4bench.loop import fair_loop
from dsv4bench.wire.client import chat_turn
from dsv4bench.harness.config import RunConfig
from dsv4bench.harness.driver import _killed_outcome, make_client
from dsv4bench.harness.nemesis import Slot, parse_kill_spec
from dsv4bench.history.records import ErrorKind, TurnStatus
from dsv4bench.wire.stream_reader import StreamBounds
from dsv4bench.wire.transport import AiohttpTransport, body_bytes
from dsv4bench.wire.turn_answer import Deadlines, TurnProbe

BODY = {"model": "m", "messages": [], "stream": True}


def _event(delta: dict, finish: str | None = None) -> bytes:
    chunk = {"id": "r1", "model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    data = f"data: {json.dumps(chunk)}\n\n".encode()
    return b"%x\r\n%s\r\n" % (len(data), data)


class Server:
    """Counts connections and how many ended; each path is one way to answer."""

    def __init__(self) -> None:
        self.connections = 0
        self.closed = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(
                    next(
                        (x.split(b":")[1] for x in head.split(b"\r\n") if x.lower().startswith(b"content-length")), b"0"
                    )
                )
                await reader.readexactly(length)
                path = head.split(b" ")[1].decode()
                if not await self.answer(path, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.closed += 1
            writer.close()

    async def answer(self, path: str, w: asyncio.StreamWriter) -> bool:
        """Write the answer; False to close the connection after it."""
        w.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        if path == "/cut-before-output":
            return False
        if path == "/stall":
            await w.drain()
            await asyncio.sleep(30)
        if path == "/first-late":
            await w.drain()
            await asyncio.sleep(0.3)
        w.write(_event({"role": "assistant", "content": ""}) + _event({"content": "Half"}))
        await w.drain()
        if path == "/first-late":
            await asyncio.sleep(0.3)
        if path in ("/ok", "/first-late"):
            w.write(_event({}, "stop") + b"%x\r\ndata: [DONE]\n\n\r\n0\r\n\r\n" % len(b"data: [DONE]\n\n"))
            return True
        if path == "/bad-chunk":
            await asyncio.sleep(0.1)
            w.write(b"zz-not-a-chunk-size\r\n")
            return False
        if path == "/long-line":
            w.write(b"%x\r\ndata: %s\r\n" % (6 + 5000, b"x" * 5000))
        while True:  # /endless, /long-line: more until the client goes
            await asyncio.sleep(0.02)
            w.write(_event({"content": " more"}))
            await w.drain()


async def _serve(fn):
    server = Server()
    srv = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"
    try:
        async with make_client(RunConfig(url=url + "/v1", concurrency=4)) as client:
            await fn(client, url, server)
    finally:
        srv.close()
        await srv.wait_closed()


def run(fn) -> None:
    anyio.run(_serve, fn)


def test_a_turns_connection_is_read_first_from_its_request_to_its_first_token():
    """On the harness's loop (fair_loop.py): while a turn waits for its first token its socket
    is in the set every wait asks first, and it leaves the set once the token is in."""
    seen: list[set[int]] = []

    async def check(client, url, server):
        capped = fair_loop._CAPPED[asyncio.get_running_loop()]

        async def watch() -> None:
            for _ in range(3):  # headers sent, first token 0.3 s later, the end 0.3 s after it
                await asyncio.sleep(0.2)
                seen.append(set(capped._first_fds))

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            out = await chat_turn(client, url + "/first-late", BODY, Deadlines(5, 5))
        assert out.status is TurnStatus.OK and out.response.content == "Half"
        seen.append(set(capped._first_fds))

    fair_loop.run(_serve, check)
    assert len(seen[0]) == 1  # awaiting the first token: its connection is read first
    assert seen[1:] == [set(), set(), set()]  # streaming, then done: in turn with the others


def test_a_body_closed_late_leaves_the_next_request_on_its_connection_read_first():
    """aiohttp pools a connection as soon as a body's last bytes are in; a reader that closes
    that body only later (a busy loop) must not take the place in the first-read set from the
    request that took the connection meanwhile (at 2,000 sessions, first tokens of such requests
    were stamped up to 240 ms late)."""

    async def check(client, url, server):
        capped = fair_loop._CAPPED[asyncio.get_running_loop()]
        earlier = await client.send(client.build_request("POST", url + "/ok", json=BODY), stream=True)
        async for _ in body_bytes(earlier):  # read to the end as chat_turn reads: the connection is pooled
            pass
        got = {}

        async def next_turn() -> None:
            got["out"] = await chat_turn(client, url + "/first-late", BODY, Deadlines(5, 5))

        async with anyio.create_task_group() as tg:
            tg.start_soon(next_turn)
            await asyncio.sleep(0.1)  # its request is out, its first token 0.3 s away
            assert len(capped._first_fds) == 1
            await earlier.aclose()  # the earlier reader is done with its body only now
            got["first_fds"] = set(capped._first_fds)
        assert server.connections == 1  # the two shared the connection
        assert len(got["first_fds"]) == 1, "the next request's connection left the first-read set"
        assert got["out"].status is TurnStatus.OK and got["out"].response.content == "Half"
        assert not capped._first_fds

    fair_loop.run(_serve, check)


def test_the_run_uses_the_aiohttp_transport():
    async def check(client, url, server):
        assert isinstance(client._transport, AiohttpTransport)

    run(check)


def test_answers_are_read_and_connections_kept_alive():
    async def check(client, url, server):
        for _ in range(3):
            out = await chat_turn(client, url + "/ok", BODY, Deadlines(5, 5))
            assert out.status is TurnStatus.OK and out.response.content == "Half" and out.response.saw_done
            assert out.response.finish_reason == "stop" and not out.response.protocol_errors
        assert server.connections == 1

    run(check)


def test_a_broken_chunk_mid_body_ends_the_read_not_the_deadline():
    async def check(client, url, server):
        out = await chat_turn(client, url + "/bad-chunk", BODY, Deadlines(10, 10))
        assert out.status is TurnStatus.OK and out.response.content == "Half"  # truncated, for the checkers
        assert out.response.finish_reason is None
        assert (out.timings.end_ns - out.timings.start_ns) / 1e9 < 5

    run(check)


def test_a_stream_cut_before_any_output_is_a_connection_error():
    async def check(client, url, server):
        out = await chat_turn(client, url + "/cut-before-output", BODY, Deadlines(5, 5))
        assert out.status is TurnStatus.ERROR and out.error_kind is ErrorKind.CONNECTION_ERROR
        assert out.error.startswith("RemoteProtocolError: ")

    run(check)


def test_a_refused_connection_is_a_connect_error():
    async def check(client, url, server):
        out = await chat_turn(client, "http://127.0.0.1:9/v1/chat/completions", BODY, Deadlines(5, 5))
        assert out.status is TurnStatus.ERROR and out.error_kind is ErrorKind.CONNECTION_ERROR
        assert out.error.startswith("ConnectError: ")

    run(check)


def test_a_bound_stops_the_read_and_drops_the_connection():
    async def check(client, url, server):
        bounds = StreamBounds(line_chars=1000)
        out = await chat_turn(client, url + "/long-line", BODY, Deadlines(5, 5), bounds=bounds)
        assert out.status is TurnStatus.OK and "SSE line longer than 1,000" in out.response.stopped_at_bound
        await anyio.sleep(0.2)
        assert server.closed == 1  # the server saw the client go

    run(check)


def test_the_deadline_ends_an_endless_stream():
    async def check(client, url, server):
        out = await chat_turn(client, url + "/endless", BODY, Deadlines(5, 0.3))
        assert out.status is TurnStatus.TIMEOUT and out.error_kind is ErrorKind.TIMEOUT_TOTAL
        await anyio.sleep(0.2)
        assert server.closed == 1

    run(check)


def test_a_killed_turn_drops_the_connection_and_keeps_what_came():
    async def check(client, url, server):
        probe = TurnProbe()
        with anyio.CancelScope() as scope:

            async def kill_when_streaming() -> None:
                while probe.phase != "streaming":
                    await anyio.sleep(0.01)
                scope.cancel()

            async with anyio.create_task_group() as tg:
                tg.start_soon(kill_when_streaming)
                await chat_turn(client, url + "/endless", BODY, Deadlines(5, 5), probe=probe)
        assert scope.cancelled_caught
        out = _killed_outcome(None, probe, Slot("s00000", killed_by=parse_kill_spec("all@1s")))
        assert out.status is TurnStatus.KILLED and out.response.content.startswith("Half")
        assert out.raw_lines and out.raw_lines[0].startswith('{"id"')
        await anyio.sleep(0.2)
        assert server.closed == 1

    run(check)


def test_read_timeout_is_httpx_read_timeout():
    async def check(client, url, server):
        async with httpx.AsyncClient(transport=AiohttpTransport(), timeout=httpx.Timeout(5, read=0.2)) as c:
            with pytest.raises(httpx.ReadTimeout):
                async with c.stream("POST", url + "/stall", content=b"{}") as resp:
                    async for _ in resp.aiter_bytes():
                        pass

    run(check)


def test_a_read_timeout_waits_on_while_bytes_keep_coming():
    """The read timer is moved lazily, not re-made per read: bytes every 20 ms keep a 150 ms
    read timeout from firing for as long as they come."""

    async def check(client, url, server):
        async with httpx.AsyncClient(transport=AiohttpTransport(), timeout=httpx.Timeout(5, read=0.15)) as c:
            async with c.stream("POST", url + "/endless", content=b"{}") as resp:
                start, pieces = anyio.current_time(), 0
                async for _ in resp.aiter_bytes():
                    pieces += 1
                    if anyio.current_time() - start > 0.6:
                        break
        assert pieces > 10

    run(check)


def test_tokens_are_stamped_when_their_bytes_arrived_not_when_a_busy_loop_parsed_them():
    """A first token that came while the loop was busy elsewhere (here: 300 ms of blocking work
    before the turn reads on) is stamped at its arrival, and so is the first byte."""

    async def check(client, url, server):
        t = {}

        async def busy_after_arrival(resp):
            await anyio.sleep(0.2)  # the answer's bytes come in meanwhile (data_received runs)
            t["before_block"] = time.monotonic_ns()
            time.sleep(0.3)  # the loop is stuck: nothing parses them yet
            t["after_block"] = time.monotonic_ns()

        transport = client._transport
        send = transport.handle_async_request

        async def slow_handler(request):
            resp = await send(request)
            await busy_after_arrival(resp)
            return resp

        transport.handle_async_request = slow_handler
        out = await chat_turn(client, url + "/ok", BODY, Deadlines(5, 5))
        assert out.status is TurnStatus.OK and out.response.content == "Half"
        assert out.timings.first_byte_ns < t["before_block"] and out.timings.first_token_ns < t["before_block"]
        assert time.monotonic_ns() > t["after_block"]

    run(check)


_STREAM_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
_STOP = _event({}, "stop") + b"%x\r\ndata: [DONE]\n\n\r\n0\r\n\r\n" % len(b"data: [DONE]\n\n")


@contextmanager
def _paced_answer(answer: Callable[[socket.socket], None]) -> Iterator[str]:
    """A server for one request on a thread of its own: `answer(conn)` writes it, paced by that
    thread's sleeps, which a blocked client loop cannot hold up. Yields the root URL. Receive
    stamps are Linux's: elsewhere the test skips."""
    if not sys.platform.startswith("linux"):
        pytest.skip("receive timestamps are taken on Linux only")
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(65536)
            answer(conn)
            time.sleep(0.5)

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()
        server.join(2)


def test_a_first_token_that_landed_while_the_loop_stood_still_is_stamped_when_it_landed():
    """The loop is blocked (300 ms) before it has read anything of the answer; the server,
    on its own thread, sends the first token 100 ms into that block. The stamp is the bytes'
    arrival, not the moment the loop got to read them."""
    sent: dict[str, int] = {}
    request_in = threading.Event()

    def answer(conn: socket.socket) -> None:
        conn.sendall(_STREAM_HEAD + _event({"role": "assistant", "content": ""}))
        request_in.set()
        time.sleep(0.15)  # the client's loop is blocked by now
        sent["first_token"] = time.monotonic_ns()
        conn.sendall(_event({"content": "Half"}) + _STOP)

    async def block_the_loop() -> None:
        while not request_in.is_set():
            await anyio.sleep(0.001)
        time.sleep(0.05)
        sent["block_from"] = time.monotonic_ns()
        time.sleep(0.3)  # the loop stands still: no socket is read
        sent["block_to"] = time.monotonic_ns()

    async def main(url: str) -> None:
        async with make_client(RunConfig(url=url + "/v1", concurrency=1)) as client:
            async with anyio.create_task_group() as tg:
                tg.start_soon(block_the_loop)
                out = await chat_turn(client, url + "/v1/chat/completions", BODY, Deadlines(5, 5))
        assert out.status is TurnStatus.OK and out.response.content == "Half"
        assert sent["block_from"] < sent["first_token"] < sent["block_to"]
        # the stamp is the arrival (a loopback hop after the send), not the end of the block
        assert 0 <= out.timings.first_token_ns - sent["first_token"] < 50_000_000
        assert out.timings.first_token_ns < sent["block_to"] - 100_000_000

    with _paced_answer(answer) as url:
        anyio.run(main, url)


def test_a_first_token_read_after_the_next_one_arrived_keeps_its_own_arrival(monkeypatch):
    """The loop reads the socket as each token lands (two reads, 150 ms apart), but the turn's
    task gets to the body only after both: the first token is stamped with its own read's
    arrival, not the connection's latest (its successor's, a TTFT 150 ms late)."""
    from dsv4bench.wire import transport

    sent: dict[str, int] = {}

    def answer(conn: socket.socket) -> None:
        conn.sendall(_STREAM_HEAD + _event({"role": "assistant", "content": ""}))
        time.sleep(0.1)
        sent["first"] = time.monotonic_ns()
        conn.sendall(_event({"content": "Half"}))
        time.sleep(0.15)
        sent["second"] = time.monotonic_ns()
        conn.sendall(_event({"content": " more"}))
        time.sleep(0.15)
        conn.sendall(_STOP)

    read_body = transport._Body.__aiter__

    async def late_reader(self):
        await anyio.sleep(0.35)  # the loop runs meanwhile: both tokens are read off the socket
        async for data in read_body(self):
            yield data

    monkeypatch.setattr(transport._Body, "__aiter__", late_reader)

    async def main(url: str) -> None:
        async with make_client(RunConfig(url=url + "/v1", concurrency=1)) as client:
            out = await chat_turn(client, url + "/v1/chat/completions", BODY, Deadlines(5, 5))
        assert out.status is TurnStatus.OK and out.response.content == "Half more"
        assert 0 <= out.timings.first_token_ns - sent["first"] < 50_000_000, out.timings.first_token_ns - sent["first"]
        # the gap between the two tokens is the one they arrived with, not zero
        assert 100 < out.timings.token_gaps_ms[0] < 200, out.timings.token_gaps_ms

    with _paced_answer(answer) as url:
        anyio.run(main, url)


def _raw_chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _sse(text: str) -> bytes:
    chunk = {"id": "r1", "model": "m", "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
    return f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n".encode()


_END = _raw_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"


@pytest.mark.parametrize(
    "name, head, reads, content",
    [
        # a character split over two reads is decoded whole
        (
            "split UTF-8",
            b"",
            [_sse("caf\u00e9 \u4e2d\u6587")[:-12], _sse("caf\u00e9 \u4e2d\u6587")[-12:]],
            "caf\u00e9 \u4e2d\u6587",
        ),
        # bytes that are not UTF-8 are replaced, as httpx's text iterator replaces them
        ("invalid UTF-8", b"", [_sse("ok").replace(b"ok", b"o\xffk")], "o\ufffdk"),
        # the response's own charset is honoured
        (
            "latin-1 charset",
            b"; charset=latin-1",
            [_sse("d\u00e9j\u00e0").decode("utf-8").encode("latin-1")],
            "d\u00e9j\u00e0",
        ),
    ],
)
def test_a_body_read_past_httpx_decodes_as_httpx_does(name, head, reads, content):
    async def check(url):
        async with make_client(RunConfig(url=url + "/v1", concurrency=1)) as client:
            out = await chat_turn(client, url + "/v1/chat/completions", BODY, Deadlines(5, 5))
            assert out.status is TurnStatus.OK, out.error
            assert out.response.content == content

    _serve_raw(b"content-type: text/event-stream" + head, [_raw_chunk(r) for r in reads] + [_END], check)


def test_a_gzipped_stream_is_read_through_httpx_and_decoded():
    import zlib

    z = zlib.compressobj(wbits=31)
    data = z.compress(_sse("squeezed")) + z.flush()

    async def check(url):
        async with make_client(RunConfig(url=url + "/v1", concurrency=1)) as client:
            out = await chat_turn(client, url + "/v1/chat/completions", BODY, Deadlines(5, 5))
            assert out.status is TurnStatus.OK, out.error
            assert out.response.content == "squeezed"

    _serve_raw(b"content-type: text/event-stream\r\ncontent-encoding: gzip", [_raw_chunk(data), b"0\r\n\r\n"], check)


def _serve_raw(headers: bytes, pieces: list[bytes], check) -> None:
    """One chunked answer: `headers`, then each piece as its own write, 20 ms apart."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\n" + headers + b"\r\ntransfer-encoding: chunked\r\n\r\n")
            for piece in pieces:
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(0.02)
        finally:
            writer.close()
            await writer.wait_closed()

    async def main() -> None:
        srv = await asyncio.start_server(handle, "127.0.0.1", 0)
        try:
            await check(f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}")
        finally:
            srv.close()
            await srv.wait_closed()

    anyio.run(main)


def _until_the_kernel_stamps(server, client) -> None:
    """Exchange bytes until the kernel stamps their arrival.

    NOTE: Linux turns receive stamping on system-wide when a first socket asks for it, and
    does it in deferred work: until then a read can carry the time it was made (CI saw a
    first read stamped 2 µs before the check, 50 ms after its bytes landed)."""
    for _ in range(100):
        server.sendall(b"w")
        time.sleep(0.02)
        assert client.recv(100) == b"w"
        if time.monotonic_ns() - client.arrived_ns(time.monotonic_ns()) > 10_000_000:
            return
    pytest.fail("the kernel stamped no read in 2 s")


def test_a_read_the_kernel_did_not_stamp_takes_its_own_time_not_the_previous_stamp():
    from dsv4bench.wire.transport import _SO_TIMESTAMPNS, _stamped_socket

    if not sys.platform.startswith("linux"):
        pytest.skip("receive timestamps are taken on Linux only")
    listener = socket.create_server(("127.0.0.1", 0))
    client = _stamped_socket((socket.AF_INET, socket.SOCK_STREAM, 0, "", listener.getsockname()))
    try:
        client.connect(listener.getsockname())
        server, _ = listener.accept()
        _until_the_kernel_stamps(server, client)
        server.sendall(b"first")
        time.sleep(0.05)
        assert client.recv(100) == b"first"
        stamped = client.arrived_ns(time.monotonic_ns())
        assert time.monotonic_ns() - stamped > 40_000_000  # the arrival, 50 ms before the read
        server.sendall(b"into")  # the read a buffered protocol (TLS) makes
        time.sleep(0.05)
        buf = bytearray(100)
        assert client.recv_into(buf) == 4 and buf[:4] == b"into"
        assert time.monotonic_ns() - client.arrived_ns(time.monotonic_ns()) > 40_000_000
        client.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 0)  # the next read comes unstamped
        server.sendall(b"second")
        time.sleep(0.05)
        assert client.recv(100) == b"second"
        now = time.monotonic_ns()
        assert client.arrived_ns(now) == now
        server.close()
    finally:
        client.close()
        listener.close()


def test_reads_over_tls_are_stamped_when_their_bytes_arrived(tmp_path):
    """Over TLS asyncio reads through recv_into (a buffered protocol), and the decrypted bytes
    reach the HTTP protocol in the same callback: they take the kernel's stamp as well. The
    server, on its own thread, answers while the client's loop stands still."""
    import shutil
    import ssl
    import subprocess

    from dsv4bench.wire.transport import _STAMPED, _stamped_socket

    if not sys.platform.startswith("linux") or shutil.which("openssl") is None:
        pytest.skip("needs Linux and the openssl command")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    client_ctx = ssl.create_default_context(cafile=str(cert))
    client_ctx.check_hostname = False
    listener = socket.create_server(("127.0.0.1", 0))
    sent: dict[str, int] = {}
    hello = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        with server_ctx.wrap_socket(conn, server_side=True) as tls:
            tls.recv(5)
            hello.set()
            time.sleep(0.05)  # the client's loop is blocked by now
            sent["at"] = time.monotonic_ns()
            tls.sendall(b"answer")
            time.sleep(0.5)

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    got: dict[str, int] = {}

    class Reader(asyncio.Protocol):
        def connection_made(self, transport):
            self.sock = _STAMPED[transport.get_extra_info("socket").fileno()]
            self.lost = asyncio.get_running_loop().create_future()

        def connection_lost(self, exc):
            self.lost.set_result(None)

        def data_received(self, data):
            got["read_at"] = now = time.monotonic_ns()
            got["stamp"] = self.sock.arrived_ns(now)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        addr = listener.getsockname()
        sock = _stamped_socket((socket.AF_INET, socket.SOCK_STREAM, 0, "", addr))
        sock.setblocking(False)
        await loop.sock_connect(sock, addr)
        transport, reader = await loop.create_connection(Reader, sock=sock, ssl=client_ctx, server_hostname="127.0.0.1")
        transport.write(b"hello")
        while not hello.is_set():
            await asyncio.sleep(0.001)
        time.sleep(0.2)  # the loop stands still while the answer lands
        while "stamp" not in got:
            await asyncio.sleep(0.001)
        # NOTE: a TLS close waits for the peer's close_notify; abort closes the socket now, and
        # the loop must see it closed before it ends, or the socket is left to the collector.
        transport.abort()
        await reader.lost

    try:
        anyio.run(main)
    finally:
        listener.close()
        server.join(2)
    assert got["read_at"] - sent["at"] > 100_000_000  # read after the block
    assert 0 <= got["stamp"] - sent["at"] < 50_000_000  # stamped at its arrival


# The aiohttp seam: transport.py subclasses aiohttp internals no release promises to keep.


def _seam_problems() -> dict[str, str]:
    import aiohttp

    from dsv4bench.wire.transport import seam_problems

    async def check() -> dict[str, str]:
        connector = aiohttp.TCPConnector()
        try:
            return seam_problems(connector)
        finally:
            await connector.close()

    return anyio.run(check)


def _seam_names() -> list[str]:
    from dsv4bench.wire.transport import SEAM

    return list(SEAM)


@pytest.mark.parametrize("internal", _seam_names())
def test_the_installed_aiohttp_keeps_each_internal_the_transport_builds_on(internal):
    """Fails on an aiohttp that changed one: the run would take httpx's slower transport. Either
    adapt transport.py to the new aiohttp, or keep pyproject.toml's pin below it."""
    import aiohttp

    from dsv4bench.wire.transport import SEAM

    problems = _seam_problems()
    assert set(problems) <= set(SEAM), f"seam_problems names internals SEAM does not: {problems}"
    assert internal not in problems, (
        f"aiohttp {aiohttp.__version__} changed {internal} ({SEAM[internal]}): {problems[internal]}"
    )


def _changed(monkeypatch, what: str) -> str:
    """Change one internal as a later aiohttp might; the SEAM name the check must report."""
    import aiohttp
    from aiohttp import client_proto

    handler = "aiohttp.client_proto.ResponseHandler"
    if what == "renamed method":
        monkeypatch.delattr(client_proto.ResponseHandler, "_reschedule_timeout")
        return f"{handler}._reschedule_timeout()"
    if what == "new signature":

        def set_response_params(self, timer=None, skip_payload=False):  # positional now
            raise AssertionError("not called over the fallback")

        monkeypatch.setattr(client_proto.ResponseHandler, "set_response_params", set_response_params)
        return f"{handler}.set_response_params(*, ...)"
    if what == "class moved":
        monkeypatch.delattr(client_proto, "ResponseHandler")
        return handler
    if what == "attribute dropped":
        start = aiohttp.ClientResponse.start

        async def started(self, connection):  # works as before, but no longer names ._protocol here
            return await start(self, connection)

        monkeypatch.setattr(aiohttp.ClientResponse, "start", started)
        return "aiohttp.ClientResponse.start sets ._protocol"
    raise ValueError(what)


@pytest.mark.parametrize("what", ["renamed method", "new signature", "class moved", "attribute dropped"])
def test_a_changed_internal_is_named_once_and_the_run_reads_its_turns_over_httpx(monkeypatch, what):
    """The run warns once, naming the internal, and serves every turn over httpx's own transport:
    answers read whole and kept alive, a broken chunk ends the read, a cut stream is a
    connection error, a deadline and a bound drop the connection."""
    from dsv4bench.wire import transport

    monkeypatch.setattr(transport, "_seam_verdict", None)  # checked afresh on this changed aiohttp
    internal = _changed(monkeypatch, what)

    async def check(client, url, server):
        for _ in range(3):
            out = await chat_turn(client, url + "/ok", BODY, Deadlines(5, 5))
            assert out.status is TurnStatus.OK and out.response.content == "Half" and out.response.saw_done
            assert out.response.finish_reason == "stop" and not out.response.protocol_errors
        assert isinstance(client._transport.fallback, httpx.AsyncHTTPTransport)
        assert server.connections == 1
        out = await chat_turn(client, url + "/bad-chunk", BODY, Deadlines(10, 10))
        assert out.response.content == "Half" and out.response.finish_reason is None
        assert (out.timings.end_ns - out.timings.start_ns) / 1e9 < 5
        out = await chat_turn(client, url + "/cut-before-output", BODY, Deadlines(5, 5))
        assert out.status is TurnStatus.ERROR and out.error_kind is ErrorKind.CONNECTION_ERROR
        assert out.error.startswith("RemoteProtocolError: ")
        closed = server.closed
        out = await chat_turn(client, url + "/endless", BODY, Deadlines(5, 0.3))
        assert out.status is TurnStatus.TIMEOUT and out.error_kind is ErrorKind.TIMEOUT_TOTAL
        out = await chat_turn(client, url + "/long-line", BODY, Deadlines(5, 5), bounds=StreamBounds(line_chars=1000))
        assert "SSE line longer than 1,000" in out.response.stopped_at_bound
        await anyio.sleep(0.2)
        assert server.closed == closed + 2  # the server saw the client go, both times

    with pytest.warns(RuntimeWarning) as seen:
        run(check)
    assert len(seen) == 1, [str(w.message) for w in seen]
    assert internal in str(seen[0].message) and "httpx's own transport" in str(seen[0].message)


def test_an_aiohttp_without_the_protocol_class_still_imports_the_transport():
    """The seam is looked up, not imported by name: the module loads and the check names it."""
    import subprocess

    code = (
        "import asyncio, aiohttp\nfrom aiohttp import client_proto\ndel client_proto.ResponseHandler\n"
        "from dsv4bench.wire import transport\n"
        "async def main():\n    c = aiohttp.TCPConnector()\n    print(sorted(transport.seam_problems(c)))\n"
        "    await c.close()\nasyncio.run(main())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "'aiohttp.client_proto.ResponseHandler'" in out.stdout
