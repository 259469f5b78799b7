"""The audit proxy as a service exposed to hostile local clients: body caps, read deadlines, a
connection limit, paths kept under the upstream's base path, no header the client did not send,
the operator's key never handed back, and the client address from the socket. The upstream here
records every path and header it receives, so what must never reach it can be seen not to."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.types import Receive, Scope, Send

import uvicorn

from dsv4bench.engine.launcher import free_port
from dsv4bench.history.run_folder import read_history
from dsv4bench.modes.proxy import (
    AuditProxy,
    KeyMask,
    ProxyLimits,
    build_app,
    upstream_path,
    uvicorn_config,
)
from dsv4bench.modes.proxy_audit import RECORDED_BODY_BYTES, ProxyRun

from .test_proxy import Served

KEY = "sk-operator-key-0123456789"
PREFIX = "/gw"  # the upstream's own base path, under which every forwarded request must stay


class RecordingUpstream:
    """An upstream that records each request's raw path and headers. /gw/v1/echo answers with the
    request's headers, in its body (sent one byte a chunk, so the key straddles every boundary)
    and in a response header; a chat completion is answered 500 so its turn keeps its request."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, str]]] = []
        self.lock = threading.Lock()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        with self.lock:
            self.seen.append((scope["raw_path"].decode("latin-1"), headers))
        while (await receive()).get("more_body"):
            pass
        path = scope["path"]
        if path.endswith("/echo"):
            body = json.dumps(headers).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                        (b"x-echo-auth", headers.get("authorization", "").encode("latin-1")),
                    ],
                }
            )
            for i in range(len(body)):
                await send({"type": "http.response.body", "body": body[i : i + 1], "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        status, body = (
            (500, b'{"error": {"message": "boom"}}')
            if path.endswith("/chat/completions")
            else (200, b'{"object": "list", "data": []}')
        )
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body, "more_body": False})

    def paths(self) -> list[str]:
        with self.lock:
            return [p for p, _ in self.seen]


@pytest.fixture(scope="module")
def upstream() -> Iterator[tuple[RecordingUpstream, Served]]:
    rec = RecordingUpstream()
    srv = Served(rec)
    yield rec, srv
    srv.stop()


class Proxy:
    def __init__(self, upstream_url: str, out: Path, limits: ProxyLimits, api_key: str | None = KEY) -> None:
        self.run = ProxyRun(out, {"command": "dsv4bench proxy (test)", "config": {}}, api_key=api_key)
        app = build_app(AuditProxy(upstream_url, self.run, api_key, limits))
        # Served with the proxy's own limits, as the CLI serves it.
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn_config(app, "127.0.0.1", self.port, log_level="critical", limits=limits))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.run.end("complete")

    def events(self, kind: str) -> list[dict]:
        return [e for e in read_history(self.run.run_dir).events if e["kind"] == kind]


LIMITS = ProxyLimits(max_body=1 << 20, read_timeout=1.0, max_connections=4, keep_alive=1)


@pytest.fixture
def proxy(upstream, tmp_path) -> Iterator[Proxy]:
    p = Proxy(f"{upstream[1].url}{PREFIX}/v1", tmp_path, LIMITS)
    yield p
    p.stop()


def raw_exchange(port: int, request: bytes, timeout: float = 5.0) -> bytes:
    """Send `request` as written (no client normalises it) and read until the proxy closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(request)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
        return got


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


def test_a_50_mb_body_is_refused_quickly_unread_and_nothing_goes_upstream(upstream, proxy):
    rec, _ = upstream
    before = len(rec.paths())

    def fifty_mb() -> Iterator[bytes]:
        piece = b"x" * (1 << 20)
        for _ in range(50):
            yield piece

    with httpx.Client(timeout=10, trust_env=False) as c:
        for headers in ({}, {"content-length": str(50 << 20)}):  # chunked, then the size said up front
            start = time.monotonic()
            r = c.post(f"{proxy.url}/v1/chat/completions", content=fifty_mb(), headers=headers)
            assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"
            assert time.monotonic() - start < 5
    assert len(rec.paths()) == before  # nothing was forwarded
    seen = [e["bytes_seen"] for e in proxy.events("request_too_large")]
    # Read in chunks and stopped at the cap: the first saw a little over 1 MiB, the second only said 50 MB.
    assert len(seen) == 2 and (1 << 20) < seen[0] < (3 << 20) and seen[1] == 50 << 20


def test_a_body_up_to_the_cap_is_forwarded_whole(upstream, proxy):
    rec, _ = upstream
    payload = json.dumps({"model": "m", "messages": [{"role": "user", "content": "y" * ((1 << 20) - 100)}]})
    with httpx.Client(timeout=10, trust_env=False) as c:
        r = c.post(f"{proxy.url}/v1/chat/completions", content=payload)
    assert r.status_code == 500 and r.json() == {"error": {"message": "boom"}}  # the upstream's answer
    assert rec.paths()[-1] == f"{PREFIX}/v1/chat/completions" and rec.seen[-1][1]["content-length"] == str(len(payload))


def test_a_failing_turns_record_keeps_a_bounded_excerpt_of_a_large_body(upstream, tmp_path):
    p = Proxy(f"{upstream[1].url}{PREFIX}/v1", tmp_path, ProxyLimits(max_body=8 << 20))
    try:
        big = json.dumps({"model": "m", "messages": [{"role": "user", "content": "z" * (RECORDED_BODY_BYTES + 10)}]})
        with httpx.Client(timeout=10, trust_env=False) as c:
            assert c.post(f"{p.url}/v1/chat/completions", content=big).status_code == 500
            assert c.post(f"{p.url}/v1/chat/completions", json={"model": "m", "messages": []}).status_code == 500
    finally:
        p.stop()
    lines = (p.run.run_dir / "turns.jsonl").read_bytes().splitlines()
    assert len(lines) == 2 and all(len(line) < 64 << 10 for line in lines)
    # In the order they were sent (the file holds them as each ends, which need not be that order).
    large, small = (r["request"] for r in sorted(map(json.loads, lines), key=lambda r: r["turn"]))
    assert large["body_bytes"] == len(big) and large["body_excerpt"] == big[:4096] and "body" not in large
    assert small["body"] == {"model": "m", "messages": []}  # a small failing body is kept whole, as before


def test_a_client_trickling_its_head_is_closed_within_the_read_timeout(proxy):
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as s:
        start = time.monotonic()
        closed_after = None
        for byte in b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100:
            try:
                s.sendall(bytes([byte]))
            except OSError:
                closed_after = time.monotonic() - start
                break
            s.settimeout(0.25)  # a byte every quarter second, answered or not
            try:
                got = s.recv(1024)
            except TimeoutError:
                continue
            assert got.startswith(b"HTTP/1.1 408") or got == b""
            closed_after = time.monotonic() - start
            break
    assert closed_after is not None and closed_after < LIMITS.read_timeout + 1.0


@pytest.mark.parametrize("first", [b"", b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"])
def test_an_idle_connection_new_or_after_an_answer_is_closed(proxy, first):
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as s:
        s.sendall(first)
        start = time.monotonic()
        got = b""
        while chunk := s.recv(65536):
            got += chunk
        assert time.monotonic() - start < LIMITS.read_timeout + 1.5
    assert (
        (status_of(got) == 200)
        if first
        else got in (b"", b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n")
    )


def test_a_client_trickling_its_body_gets_408_within_the_read_timeout(upstream, proxy):
    rec, _ = upstream
    before = len(rec.paths())
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
        start = time.monotonic()
        s.settimeout(0.25)
        got = b""
        while time.monotonic() - start < 5:
            try:
                s.sendall(b"{")
                chunk = s.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            if not chunk:
                break
            got += chunk
        took = time.monotonic() - start
    assert status_of(got) == 408 and took < LIMITS.read_timeout + 1.0
    assert len(rec.paths()) == before and proxy.events("request_timeout")


def test_connections_over_the_limit_are_answered_503(proxy):
    idle = [socket.create_connection(("127.0.0.1", proxy.port), timeout=5) for _ in range(LIMITS.max_connections)]
    try:
        time.sleep(0.1)
        r = httpx.get(f"{proxy.url}/v1/models", timeout=5, trust_env=False)
        assert r.status_code == 503
        idle.pop().close()
        time.sleep(0.1)
        assert httpx.get(f"{proxy.url}/v1/models", timeout=5, trust_env=False).status_code == 200
    finally:
        for s in idle:
            s.close()


ESCAPES = [
    b"/v1/../../admin",
    b"/v1/%2e%2e/%2e%2e/admin",
    b"/v1/%2E%2E/%2e./admin",
    b"//evil.example/x",
    b"/v1/..%2f..%2fadmin",
    b"/v1/%2f/admin",
    b"/v1\\..\\..\\admin",
    b"/v1/%5c..%5cadmin",
    b"/v1/%252e%252e/%252e%252e/admin",
    b"/v1/%00/x",
    b"/v1/./models",
    b"http://evil.example/admin",
    b"*",
]


@pytest.mark.parametrize("target", ESCAPES)
def test_a_path_that_would_leave_the_upstreams_prefix_is_refused_and_sent_nowhere(upstream, proxy, target):
    rec, _ = upstream
    before = len(rec.paths())
    got = raw_exchange(proxy.port, b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status_of(got) in (400, 404), got[:200]
    assert rec.paths()[before:] == []
    assert all(p.startswith(PREFIX + "/") for p in rec.paths())


def test_upstream_path_keeps_ordinary_paths():
    for path in (
        b"/v1/models",
        b"/v1/chat/completions",
        b"/v1/models/org-model%20x",
        b"/",
        b"/v1/",
        b"/metrics",
        b"/v1/files/file-abc.jsonl",
        b"/v1/models/..model",
    ):
        assert upstream_path(path) == path.decode()


def test_the_key_echoed_by_the_upstream_never_reaches_the_client(upstream, proxy):
    rec, _ = upstream
    with httpx.Client(timeout=10, trust_env=False) as c:
        r = c.get(f"{proxy.url}/v1/echo", headers={"accept-encoding": "gzip"})
    assert rec.seen[-1][1]["authorization"] == f"Bearer {KEY}"  # the upstream got it
    assert r.status_code == 200 and KEY not in r.text and all(KEY not in v for v in r.headers.values())
    assert r.json()["authorization"] == "Bearer " + "*" * len(KEY) and r.headers["x-echo-auth"] == "Bearer ***"
    # Asked for gzip, but a request the key was added to is answered uncompressed, so it can be masked.
    assert "accept-encoding" not in rec.seen[-1][1]


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64])
def test_the_key_mask_finds_the_key_across_any_chunk_boundary(size):
    mask = KeyMask(KEY)
    stream = (b'data: {"a": "' + KEY.encode() + b'"}\n\nsk-oper sk-' + KEY.encode()[:-1] + b"\n\n") * 3 + b"sk-op"
    out = b"".join(mask.chunk(stream[i : i + size]) for i in range(0, len(stream), size)) + mask.rest()
    assert out == stream.replace(KEY.encode(), b"*" * len(KEY)) and len(out) == len(stream)
    # An event's end is never held back waiting for the next chunk.
    assert mask.chunk(b"data: {}\n\n") == b"data: {}\n\n"


def test_no_header_the_client_did_not_send_reaches_the_upstream(upstream, proxy):
    rec, _ = upstream
    got = raw_exchange(proxy.port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Mine: 1\r\nConnection: close\r\n\r\n")
    assert status_of(got) == 200
    headers = rec.seen[-1][1]
    assert headers["x-mine"] == "1" and headers["authorization"] == f"Bearer {KEY}"  # the key, as documented
    assert not {"accept", "accept-encoding", "user-agent", "cookie"} & set(headers), headers


def test_a_body_without_a_content_type_goes_upstream_without_one(upstream, proxy):
    rec, _ = upstream
    got = raw_exchange(
        proxy.port, b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
    )
    assert status_of(got) == 200
    path, headers = rec.seen[-1][0], rec.seen[-1][1]
    assert path == f"{PREFIX}/v1/embeddings" and headers["content-length"] == "2"
    assert "content-type" not in headers, headers  # no guess (application/octet-stream) of the proxy's


@pytest.mark.parametrize("method", [b"TRACE", b"CONNECT", b"BREW"])
def test_a_method_no_openai_server_answers_is_refused_and_sent_nowhere(upstream, proxy, method):
    rec, _ = upstream
    before = len(rec.paths())
    got = raw_exchange(proxy.port, method + b" /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status_of(got) in (400, 405), got[:200]
    assert rec.paths()[before:] == []


def test_a_client_with_its_own_key_keeps_it_and_its_headers(upstream, proxy):
    rec, _ = upstream
    with httpx.Client(timeout=10, trust_env=False) as c:
        c.get(f"{proxy.url}/v1/models", headers={"authorization": "Bearer mine-123456", "user-agent": "agent/1"})
    headers = rec.seen[-1][1]
    assert headers["authorization"] == "Bearer mine-123456" and headers["user-agent"] == "agent/1"
    assert "accept-encoding" in headers  # the client's own, kept: the key it sent needs no masking


@pytest.mark.parametrize("trust, session", [(False, "127.0.0.1"), (True, "10.9.8.7")])
def test_x_forwarded_for_names_the_client_only_when_trusted(upstream, tmp_path, trust, session):
    p = Proxy(f"{upstream[1].url}{PREFIX}/v1", tmp_path, ProxyLimits(trust_forwarded=trust))
    try:
        with httpx.Client(timeout=10, trust_env=False) as c:
            c.post(
                f"{p.url}/v1/chat/completions",
                json={"model": "m", "messages": []},
                headers={"x-forwarded-for": "6.6.6.6, 10.9.8.7"},
            )
    finally:
        p.stop()
    (turn,) = read_history(p.run.run_dir).turns
    assert turn.session == session


def test_the_fast_path_for_plain_paths_decides_as_the_long_way_does(monkeypatch):
    """upstream_path accepts most paths by one pattern; every path it accepts so, the full
    segment-by-segment reading accepts too, with the same result (random paths of dots, slashes,
    escapes and letters)."""
    import random
    import re

    from dsv4bench.modes import proxy as proxy_mode

    rng = random.Random(7)
    pieces = ["a", "v1", ".", "..", "...", "%2e", "%2f", "-", "_", "~", "x.y", "", "%5c", "\\"]
    paths = [b"/" + "/".join(rng.choice(pieces) for _ in range(rng.randint(1, 4))).encode() for _ in range(3000)]
    paths += [p + b"/" for p in paths[:300]]

    def decide(path: bytes) -> str:
        try:
            return upstream_path(path)
        except Exception as e:  # noqa: BLE001 - a refusal is an answer here
            return f"refused: {type(e).__name__}"

    fast = [decide(p) for p in paths]
    monkeypatch.setattr(proxy_mode, "_PLAIN_PATH", re.compile(rb"(?!)"))  # never matches: the long way alone
    slow = [decide(p) for p in paths]
    assert fast == slow
    assert sum(not f.startswith("refused") for f in fast) > 100 and sum(f.startswith("refused") for f in fast) > 100


def test_credentials_in_the_upstream_url_go_as_basic_auth_and_never_in_the_url(upstream, tmp_path):
    rec, srv = upstream
    host = srv.url.removeprefix("http://")
    p = Proxy(f"http://gw-user:gw-pass-0123@{host}{PREFIX}/v1", tmp_path, LIMITS, api_key=None)
    try:
        with httpx.Client(timeout=10, trust_env=False) as c:
            assert c.get(f"{p.url}/v1/models").status_code == 200
            basic = rec.seen[-1][1]["authorization"]
            assert c.get(f"{p.url}/v1/models", headers={"Authorization": "Bearer mine"}).status_code == 200
            own = rec.seen[-1][1]["authorization"]
    finally:
        p.stop()
    assert basic == "Basic " + base64.b64encode(b"gw-user:gw-pass-0123").decode()
    assert own == "Bearer mine"  # a client's own credentials are its own
    assert rec.paths()[-1] == f"{PREFIX}/v1/models"
    assert "gw-pass-0123" in p.run.secrets.secrets  # learnt: no file of the run will hold it


def test_a_client_looping_on_refused_requests_cannot_write_the_run_folder_full(upstream, tmp_path):
    from dsv4bench.modes.proxy import RefusalLog

    p = Proxy(f"{upstream[1].url}{PREFIX}/v1", tmp_path, LIMITS)
    try:
        with httpx.Client(timeout=10, trust_env=False) as c:
            for _ in range(300):
                assert c.get(f"{p.url}/v1/%2e%2e/admin").status_code == 400  # every one still refused
    finally:
        p.stop()  # the serving loop's end says what the budget dropped
    written = p.events("path_refused")
    said = p.events("events_suppressed")
    assert RefusalLog.BURST <= len(written) < 60  # the burst, and what the rate let through meanwhile
    assert {e["refusal"] for e in said} == {"path_refused"}
    assert len(written) + sum(e["count"] for e in said) == 300  # each refusal written or counted
