"""The audit proxy in process: a deterministic fake upstream and the proxy, each on a real uvicorn
server on loopback, driven by raw httpx. What the client gets through the proxy must be the
upstream's bytes exactly; what the history holds must be what the checkers make of them."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from dsv4bench.engine.launcher import free_port
from dsv4bench.history.run_folder import HistoryError, read_history
from dsv4bench.modes.proxy import AuditProxy, build_app, uvicorn_config
from dsv4bench.modes.proxy_audit import ProxyRun, WorkerAudit
from dsv4bench.history.records import TurnStatus
from dsv4bench.report import build_report

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
                "additionalProperties": False,
            },
        },
    }
]
BAR = "\uff5c"
LEAK = f'<{BAR}DSML{BAR}tool_calls><{BAR}DSML{BAR}invoke name="read_file">'
SECRET = "sk-client-secret-4242"
PROXY_KEY = "sk-proxy-added-7777"


def chunk(delta: dict, finish: str | None = None) -> bytes:
    body = {
        "id": "chatcmpl-fixed",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "fake",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n".encode()


def tool_call_stream() -> list[bytes]:
    return [
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Let me look."}),
        chunk(
            {
                "tool_calls": [
                    {"index": 0, "id": "call_0", "type": "function", "function": {"name": "read_file", "arguments": ""}}
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"path": "src/ma'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'in.py"}'}}]}),
        chunk({}, "tool_calls"),
        b"data: [DONE]\n\n",
    ]


def leaked_stream() -> list[bytes]:
    return [
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Let me look.\n\n" + LEAK}),
        chunk({}, "stop"),
        b"data: [DONE]\n\n",
    ]


class FakeUpstream:
    """Answers chosen by the X-Fake header, byte for byte the same on every call."""

    def __init__(self) -> None:
        self.closed = threading.Event()  # a `hang` answer was closed from the proxy's side
        self.seen_auth: list[str | None] = []

    async def chat(self, request: Request) -> Response:
        body = await request.json()
        kind = request.headers.get("x-fake", "clean")
        self.seen_auth.append(request.headers.get("authorization"))
        if kind == "echo":
            return JSONResponse(
                {
                    "error": {
                        "message": f"bad key: {request.headers.get('authorization')} {request.headers.get('api-key')}"
                    }
                },
                status_code=401,
            )
        if not body.get("stream"):
            msg = {
                "role": "assistant",
                "content": "Let me look.",
                "tool_calls": [
                    {
                        "id": "call_0",
                        "type": "function",
                        "function": {"name": "read_file", "arguments": '{"path": "src/main.py"}'},
                    }
                ],
            }
            return JSONResponse(
                {
                    "id": "chatcmpl-fixed",
                    "object": "chat.completion",
                    "created": 1700000000,
                    "model": "fake",
                    "choices": [{"index": 0, "message": msg, "finish_reason": "tool_calls"}],
                }
            )
        if kind == "redirect":
            return Response(b"", status_code=307, headers={"location": "https://gateway.example/v1/chat/completions"})
        pieces = leaked_stream() if kind == "dsml" else tool_call_stream()
        media_type = "text/event-stream; charset=zlib" if kind == "zlib" else "text/event-stream"

        async def gen():
            try:
                for i, piece in enumerate(pieces):
                    yield piece
                    if kind == "slow" and i == 0:
                        await asyncio.sleep(0.5)
                    if kind == "hang" and i == 1:
                        await asyncio.sleep(30)
                    if kind == "linger" and i == len(pieces) - 1:  # [DONE] sent, the body's end held back
                        await asyncio.sleep(30)
                    if kind == "cut" and i == 2:
                        raise ConnectionResetError("cut mid-stream")
            finally:
                if kind in ("hang", "linger"):
                    self.closed.set()

        return StreamingResponse(gen(), media_type=media_type)

    def app(self) -> Starlette:
        async def models(_: Request) -> Response:
            return JSONResponse({"object": "list", "data": [{"id": "fake", "object": "model"}]})

        return Starlette(
            routes=[Route("/v1/chat/completions", self.chat, methods=["POST"]), Route("/v1/models", models)]
        )


class Served:
    """uvicorn serving `app` from a daemon thread on a free loopback port, as the proxy serves."""

    def __init__(self, app: Starlette, plain: bool = False) -> None:
        self.port = free_port()
        config = (
            uvicorn.Config(app, "127.0.0.1", self.port, log_level="critical", http="httptools", lifespan="on")
            if plain  # any ASGI server: none of the proxy's own protocol
            else uvicorn_config(app, "127.0.0.1", self.port, log_level="critical")
        )
        self.server = uvicorn.Server(config)
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


@pytest.fixture(scope="module")
def upstream() -> Iterator[tuple[FakeUpstream, Served]]:
    fake = FakeUpstream()
    srv = Served(fake.app())
    yield fake, srv
    srv.stop()


def start_proxy(
    upstream_url: str, out: Path, api_key: str | None = None, audit: str = "inline"
) -> tuple[ProxyRun | WorkerAudit, Served]:
    """The proxy audited in its serving loop (`inline`), or by a worker process as the CLI runs it."""
    info = {"command": "dsv4bench proxy (test)", "config": {"upstream": upstream_url}}
    if audit == "worker":
        worker = WorkerAudit(out, info, api_key, capture=False, quiet=True)
        return worker, Served(build_app(AuditProxy(upstream_url, worker, api_key)))
    run = ProxyRun(out, info, api_key=api_key)
    return run, Served(build_app(AuditProxy(upstream_url, run, api_key)))


@pytest.fixture(params=["inline", "worker"])
def proxied(upstream, tmp_path, request) -> Iterator[tuple[ProxyRun | WorkerAudit, Served, Served]]:
    run, proxy = start_proxy(f"{upstream[1].url}/v1", tmp_path, audit=request.param)
    yield run, proxy, upstream[1]
    proxy.stop()
    run.end("complete")


def body(stream: bool = True, **extra) -> dict:
    return {
        "model": "fake",
        "messages": [{"role": "user", "content": "read main"}],
        "tools": TOOLS,
        "stream": stream,
        **extra,
    }


def exchange(url: str, payload: dict, headers: dict | None = None) -> tuple[int, dict[str, str], bytes]:
    with httpx.Client(timeout=10, trust_env=False) as c:
        r = c.post(f"{url}/v1/chat/completions", json=payload, headers=headers or {})
        kept = {k: v for k, v in r.headers.items() if k not in ("date", "server", "connection", "keep-alive")}
        return r.status_code, kept, r.content


def wait_turns(run: ProxyRun | WorkerAudit, n: int, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            turns = read_history(run.run_dir).turns
        except HistoryError:  # a worker that has not made the run folder yet
            if time.monotonic() > deadline:
                raise
            turns = []
        if len(turns) >= n or time.monotonic() > deadline:
            return turns
        time.sleep(0.02)


@pytest.mark.parametrize(
    "kind, stream, codes", [("clean", True, []), ("clean", False, []), ("dsml", True, ["dsml_leak_content"])]
)
def test_the_client_gets_the_upstreams_bytes_and_the_history_its_verdicts(proxied, kind, stream, codes):
    run, proxy, up = proxied
    direct = exchange(up.url, body(stream), {"x-fake": kind})
    through = exchange(proxy.url, body(stream), {"x-fake": kind, "x-dsv4bench-session": "agent-1"})
    assert through == direct
    (turn,) = wait_turns(run, 1)
    assert (turn.session, turn.turn, turn.status) == ("agent-1", 0, TurnStatus.OK)
    assert sorted({v.code for v in turn.verdicts}) == codes
    assert turn.response.finish_reason == ("stop" if codes else "tool_calls")
    if not codes:
        assert [(c.name, c.arguments) for c in turn.response.tool_calls] == [("read_file", '{"path": "src/main.py"}')]
        assert "body" not in turn.request and turn.raw_sse is None
    else:  # a failing turn keeps its request and its stream, as agents keeps them
        assert turn.request["body"]["tools"] == TOOLS and any(
            f"{BAR}DSML{BAR}tool_calls" in line for line in turn.raw_sse
        )


@pytest.mark.parametrize(
    "kind, kind_of_error, says",
    [
        ("zlib", "connection_error", "DecodingError: the body does not decode as charset 'zlib'"),
        ("redirect", "http_error", "HTTP 307: (empty body) (Location: https://gateway.example/v1/chat/completions)"),
    ],
)
def test_an_answer_it_cannot_read_as_a_chat_is_the_servers_error_and_passes_through(proxied, kind, kind_of_error, says):
    # What agents makes of the same answer (tests/test_unusual_server.py): never the audit's own failure.
    run, proxy, up = proxied
    assert exchange(proxy.url, body(), {"x-fake": kind}) == exchange(up.url, body(), {"x-fake": kind})
    (turn,) = wait_turns(run, 1)
    assert turn.status is TurnStatus.ERROR and turn.error_kind == kind_of_error and turn.check_errors == []
    assert turn.error.startswith(says)


def test_each_chunk_is_passed_on_when_it_comes(proxied):
    _, proxy, _ = proxied
    arrivals: list[float] = []
    with httpx.Client(timeout=10, trust_env=False) as c:
        start = time.monotonic()
        with c.stream("POST", f"{proxy.url}/v1/chat/completions", json=body(), headers={"x-fake": "slow"}) as r:
            for _ in r.iter_raw():
                arrivals.append(time.monotonic() - start)
    # The upstream holds 0.5 s after its first chunk: that chunk must not wait for the rest.
    assert arrivals[0] < 0.4 and arrivals[-1] >= 0.5


def test_turns_are_numbered_per_session_from_the_header_the_user_field_or_the_address(proxied):
    run, proxy, _ = proxied
    exchange(proxy.url, body(), {"x-dsv4bench-session": "a"})
    exchange(proxy.url, body(user="u-7"))
    exchange(proxy.url, body(), {"x-dsv4bench-session": "a"})
    exchange(proxy.url, body())
    turns = wait_turns(run, 4)
    assert sorted((t.session, t.turn) for t in turns) == [("127.0.0.1", 0), ("a", 0), ("a", 1), ("u-7", 0)]


@pytest.mark.parametrize("audit", ["inline", "worker"])
def test_secrets_in_headers_never_reach_the_run_folder(upstream, tmp_path, audit):
    fake, up = upstream
    run, proxy = start_proxy(f"{up.url}/v1", tmp_path, api_key=PROXY_KEY, audit=audit)
    try:
        status, _, content = exchange(
            proxy.url, body(), {"x-fake": "echo", "authorization": f"Bearer {SECRET}", "api-key": "azure-key-31337"}
        )
        assert status == 401 and SECRET.encode() in content and b"azure-key-31337" in content  # passed on as sent
        status, _, content = exchange(proxy.url, body(), {"x-fake": "echo"})
        # A client with no key of its own gets --api-key's upstream, but never sees it echoed back.
        assert PROXY_KEY.encode() not in content and b"Bearer " + b"*" * len(PROXY_KEY) in content
        assert fake.seen_auth[-2:] == [f"Bearer {SECRET}", f"Bearer {PROXY_KEY}"]
        turns = wait_turns(run, 2)
    finally:
        proxy.stop()
    run.end("complete")
    build_report(run.run_dir)
    assert [t.error_kind.value for t in turns] == ["http_error", "http_error"]
    assert turns[0].request["headers"]["authorization"] == "***"
    for f in run.run_dir.rglob("*"):
        if f.is_file() and f.suffix in (".json", ".jsonl", ".md"):
            text = f.read_text()
            assert SECRET not in text and PROXY_KEY not in text and "azure-key-31337" not in text, f


def leave_mid_stream(fake: FakeUpstream, run: ProxyRun | WorkerAudit, proxy_url: str) -> None:
    """A client that reads the first bytes of a stream the upstream holds open, then goes: the
    upstream request is closed and the turn is killed, unjudged."""
    fake.closed.clear()
    with httpx.Client(timeout=10, trust_env=False) as c:
        with c.stream("POST", f"{proxy_url}/v1/chat/completions", json=body(), headers={"x-fake": "hang"}) as r:
            next(r.iter_raw())
    assert fake.closed.wait(5), "the upstream request was left open"
    (turn,) = wait_turns(run, 1)
    assert turn.status is TurnStatus.KILLED and turn.error == "the client disconnected" and not turn.verdicts


def test_a_client_that_leaves_closes_the_upstream_request_and_the_turn_is_killed(upstream, proxied):
    run, proxy, _ = proxied
    leave_mid_stream(upstream[0], run, proxy.url)


def test_under_another_asgi_server_a_client_that_leaves_is_seen_all_the_same(upstream, tmp_path):
    # No CLIENT_GONE in the scope: a task of the proxy's waits for `receive` to say so instead.
    fake, up = upstream
    run = ProxyRun(tmp_path, {"command": "dsv4bench proxy (test)", "config": {}})
    proxy = Served(build_app(AuditProxy(f"{up.url}/v1", run)), plain=True)
    try:
        leave_mid_stream(fake, run, proxy.url)
    finally:
        proxy.stop()
        run.end("complete")


def test_a_client_that_leaves_once_the_stream_said_done_has_its_answer_judged(upstream, proxied):
    # The OpenAI SDK closes its response at [DONE]; the upstream's chunked end may come later.
    fake, _ = upstream
    run, proxy, _ = proxied
    fake.closed.clear()
    got = b""
    with httpx.Client(timeout=10, trust_env=False) as c:
        with c.stream("POST", f"{proxy.url}/v1/chat/completions", json=body(), headers={"x-fake": "linger"}) as r:
            for piece in r.iter_raw():
                got += piece
                if b"data: [DONE]" in got:
                    break
    assert fake.closed.wait(5), "the upstream request was left open"
    (turn,) = wait_turns(run, 1)
    assert turn.status is TurnStatus.OK and turn.error is None and turn.verdicts == [], turn
    assert turn.response.finish_reason == "tool_calls" and turn.response.tool_calls[0].name == "read_file"


def test_an_upstream_cut_mid_stream_reaches_the_client_cut_and_the_history_truncated(proxied):
    run, proxy, _ = proxied
    with httpx.Client(timeout=10, trust_env=False) as c, pytest.raises(httpx.RemoteProtocolError):
        c.post(f"{proxy.url}/v1/chat/completions", json=body(), headers={"x-fake": "cut"})
    (turn,) = wait_turns(run, 1)
    assert turn.status is TurnStatus.OK and "truncated" in {v.code for v in turn.verdicts}


@pytest.mark.parametrize("audit", ["inline", "worker"])
def test_an_upstream_that_is_down_is_a_502_and_the_proxy_serves_on(upstream, tmp_path, audit):
    run, proxy = start_proxy(f"http://127.0.0.1:{free_port()}/v1", tmp_path, audit=audit)
    try:
        for _ in range(2):
            status, _, content = exchange(proxy.url, body())
            assert status == 502 and json.loads(content)["error"]["type"] == "upstream_unreachable"
        turns = wait_turns(run, 2)
    finally:
        proxy.stop()
        run.end("complete")
    assert [(t.status, t.error_kind.value) for t in turns] == [(TurnStatus.ERROR, "connection_error")] * 2


def test_other_paths_and_unreadable_bodies_pass_through_unjudged(proxied):
    run, proxy, up = proxied
    with httpx.Client(timeout=10, trust_env=False) as c:
        assert c.get(f"{proxy.url}/v1/models").content == c.get(f"{up.url}/v1/models").content
        direct = c.post(f"{up.url}/v1/chat/completions", content=b"{not json")
        through = c.post(f"{proxy.url}/v1/chat/completions", content=b"{not json")
        assert (through.status_code, through.content) == (direct.status_code, direct.content)
        assert c.get(f"{proxy.url}/nowhere").status_code == 404
    run.end("complete")
    history = read_history(run.run_dir)
    assert history.turns == [] and [e["kind"] for e in history.events if e["kind"] == "unaudited_request"]


def test_the_report_reads_a_proxy_run(proxied):
    run, proxy, _ = proxied
    exchange(proxy.url, body(), {"x-fake": "dsml"})
    exchange(proxy.url, body())
    wait_turns(run, 2)
    run.end("complete")
    summary = build_report(run.run_dir)
    assert summary["verdict"] == "CORRUPTION" and summary["turns"]["total"] == 2 and summary["turns"]["corrupt"] == 1
    assert (run.run_dir / "report.md").exists()


def test_refusals_are_noted_within_a_budget_and_the_rest_counted():
    from dsv4bench.modes.proxy import RefusalLog

    written: list[tuple[str, dict]] = []
    now = [100.0]
    log = RefusalLog(lambda kind, **f: written.append((kind, f)), clock=lambda: now[0])
    for _ in range(500):  # a client looping on a bad path, all within one instant
        log.note("path_refused", status=400, path="/v1/../x")
    kinds = [k for k, _ in written]
    assert kinds.count("path_refused") == RefusalLog.BURST
    assert written[RefusalLog.BURST] == ("events_suppressed", {"refusal": "path_refused", "count": 1})
    assert kinds.count("events_suppressed") == 1  # said at most once a second
    log.note("request_too_large", status=413, bytes_seen=9, max_body=8, declared=True)  # its own budget
    assert written[-1][0] == "request_too_large"
    now[0] += 1.0  # a second on: RATE more are written, and the drops since are said
    for _ in range(10):
        log.note("path_refused", status=400, path="/v1/../x")
    assert [k for k, _ in written[-3:]] == ["path_refused", "path_refused", "events_suppressed"]
    log.flush()
    dropped = sum(f["count"] for k, f in written if k == "events_suppressed")
    assert dropped + kinds.count("path_refused") + 2 == 510  # every refusal written or counted
    log.flush()  # nothing left to say
    assert sum(f["count"] for k, f in written if k == "events_suppressed") == dropped
