"""`dsv4bench proxy`: an OpenAI-compatible pass-through that audits a user's own agent live.

Every request is forwarded to the upstream server with httpx, and the upstream's status,
headers (hop-by-hop ones excepted) and body bytes go back to the client unchanged, each
chunk written the moment it arrives. A chat completion's bytes are also fed, as the client
gets them, to the same sans-IO reading `agents` uses (turn_answer.py); when the exchange
ends it becomes one TurnRecord judged by the same checkers and written to the same history
format, so `dsv4bench report` reads a proxy's run folder as it reads any other.

The audit never stands in the way: a checker that fails, a body the reader cannot decode or
a history write that fails costs the record, never the client's bytes. A client that goes away
closes the upstream request (the turn is `killed`); an upstream that cannot be reached is a
502 to the client and a `connection_error` turn in the history.
"""

from __future__ import annotations

import codecs
import contextlib
import datetime as dt
import json
import logging
import secrets
import time
import zlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from .charset import Charset
from .checks import run_checks
from .history import HistoryWriter
from .records import TurnContext, TurnRecord, TurnStatus
from .redact import MASK, Redactor
from .replay import HOP_BY_HOP
from .turn_judge import client_request_summary, keeps_evidence, request_context
from .stream_reader import DEFAULT_BOUNDS, StreamBounds
from .turn_answer import (
    StreamedAnswer,
    TurnOutcome,
    finish,
    is_event_stream,
    is_http_error,
    take_completion,
    take_connection_error,
    take_http_error,
    take_not_a_stream,
)

# Set by httpx for the upstream connection itself; `expect` is answered by the proxy's own server.
_SET_UPSTREAM = frozenset({"host", "content-length", "expect"})
# Header names whose values are credentials: learnt as secrets, masked where headers are kept.
_SECRET_HEADER_WORDS = ("auth", "key", "token", "secret", "cookie", "password")
# The headers that carry an API key: a client that sends none gets --api-key's added.
_API_KEY_HEADERS = frozenset({"authorization", "api-key", "x-api-key"})
SESSION_HEADER = "x-dsv4bench-session"
UPSTREAM_POOLS = 16  # see AuditProxy._next_client
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


class UpstreamBroke(Exception):
    """The upstream cut its answer after the status line: raised out of the ASGI app so the
    server closes the client's connection too, and the client sees the same broken stream."""


class LearntSecrets(Redactor):
    """The run's secrets, grown by every credential a client sends through the proxy, so no
    file of the run ever holds one (a server that echoes a key in an error, say)."""

    def __bool__(self) -> bool:
        return True  # applied from the first record on, before any key has come

    def learn(self, value: str) -> None:
        value = value.strip()
        _, _, token = value.partition(" ")  # `Bearer KEY`: the key alone is a secret too
        found = [value, token.strip()] if token else [value]
        if any(v not in self.secrets for v in found):
            self.secrets = Redactor([*self.secrets, *found]).secrets


def is_secret_header(name: str) -> bool:
    return any(word in name.lower() for word in _SECRET_HEADER_WORDS)


def upstream_base(upstream: str) -> tuple[str, str]:
    """(where client paths are appended, the OpenAI base URL) of an --upstream given as a server's
    root or its /v1 base: http://h:p/v1 and http://h:p both forward /v1/chat/completions to
    http://h:p/v1/chat/completions; a gateway prefix before /v1 is kept."""
    root = upstream.rstrip("/")
    root = root[: -len("/v1")] if root.endswith("/v1") else root
    return root, f"{root}/v1"


def _content_decoder(encoding: str) -> Callable[[bytes], bytes] | None:
    """How the audit reads a body of this Content-Encoding (the client gets it as it came);
    None for an encoding it cannot read."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return lambda data: data
    if encoding in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress
    if encoding == "deflate":
        return zlib.decompressobj().decompress
    return None


@dataclass
class ChatExchange:
    """One chat completion as it passes through: the request, and what its answer's bytes
    become, read the way `agents` reads its own (turn_answer.py)."""

    session: str
    turn: int
    scenario: str
    seed: int
    body: dict[str, Any]
    headers: dict[str, str]  # the client's, credentials masked: kept with a failing turn's body
    bounds: StreamBounds = DEFAULT_BOUNDS
    out: TurnOutcome = field(default_factory=TurnOutcome.starting)
    problems: list[str] = field(default_factory=list)  # what the audit could not read: check_errors
    settled: bool = False  # the outcome is known; later events change nothing
    _reading: str = ""  # "sse", "body", "error", "not_sse", or "" once nothing more is read
    _answer: StreamedAnswer | None = None
    _content: Callable[[bytes], bytes] | None = None
    _text: Charset | None = None
    _head: bytearray = field(default_factory=bytearray)
    _limit: int = 0
    _over: bool = False
    _resp_headers: httpx.Headers = field(default_factory=httpx.Headers)

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    def started(self, status: int, headers: httpx.Headers) -> None:
        """The upstream's status line and headers arrived: how its body will be read."""
        self.out.timings.first_byte_ns = time.monotonic_ns()
        self.out.http_status = status
        self._resp_headers = headers
        self._content = _content_decoder(headers.get("content-encoding", ""))
        if self._content is None:
            self.problems.append(f"Content-Encoding {headers.get('content-encoding', '')[:40]!r}: the proxy "
                                 "cannot read it; the answer passed through unjudged")
            return
        if is_http_error(status):
            self._reading, self._limit = "error", self.bounds.error_body_bytes
        elif self.stream and not is_event_stream(headers):
            self._reading, self._limit = "not_sse", 4096
        elif self.stream:
            self._reading, self._answer = "sse", StreamedAnswer(self.out, None, self.bounds)
            self._text = Charset(headers_charset(headers))
        else:
            self._reading, self._limit = "body", self.bounds.body_bytes

    def chunk(self, raw: bytes) -> None:
        """The next bytes of the body, as the client got them."""
        if not self._reading or self._content is None:
            return
        data = self._content(raw)
        if self._reading == "sse":
            assert self._answer is not None and self._text is not None
            if not self._answer.feed(self._text.decode(data)):
                self._reading = ""  # a bound, or the stream's end: the rest passes unread
        elif not self._over:
            self._head += data
            if len(self._head) > self._limit:
                del self._head[self._limit:]
                self._over = True

    def ended(self) -> None:
        """The body ended as HTTP says it should."""
        if self.settled:
            return
        if self._reading == "sse" and self._answer is not None and self._text is not None:
            self._answer.feed(self._text.decode(b"", final=True))
            self._answer.end_of_body()
        self._settle_read()

    def broke(self, e: BaseException) -> None:
        """The upstream's body broke off: a stream cut after some output is a truncated answer
        (judged), otherwise the connection failed, as client.py reads it."""
        if self.settled:
            return
        if self._reading in ("error", "not_sse") or (self._answer is not None and self._answer.any_output):
            self._settle_read()
        else:
            take_connection_error(self.out, e)
            self.settled = True

    def unreachable(self, e: BaseException) -> None:
        """No answer at all: the upstream could not be reached."""
        take_connection_error(self.out, e)
        self.settled = True

    def killed(self, why: str) -> None:
        """The exchange ended before its answer did (the client left, the proxy stopped): not judged.
        A stream that had said [DONE] had ended for its client, which may close at once (the
        OpenAI SDK does) before the upstream's last bytes, the chunked body's end, arrive: judged."""
        if self.settled:
            return
        if self._answer is not None and self._answer.asm.response.saw_done:
            self.ended()
            return
        self.out.status, self.out.error_kind, self.out.error = TurnStatus.KILLED, None, why
        if self._answer is not None:
            self._answer.close()
            self.out.response = self._answer.asm.response
        self.settled = True

    def audit_failed(self, e: BaseException) -> None:
        """Reading the answer raised: the turn is recorded with what is known, the rest unread. A
        body its charset cannot decode is the server's answer, as client.py reads it, not ours."""
        if isinstance(e, httpx.DecodingError):
            take_connection_error(self.out, e)
            self.settled, self._reading = True, ""
            return
        self.problems.append(f"proxy audit: {type(e).__name__}: {e}"[:300])
        self._reading = ""

    def _settle_read(self) -> None:
        self.settled = True
        status = self.out.http_status or 0
        if self._answer is not None:
            self.out.response = self._answer.finish()
        elif is_http_error(status):
            take_http_error(self.out, status, self._resp_headers, bytes(self._head))
        elif self._content is None:
            return  # an encoding the audit cannot read: `problems` says so
        elif self.stream and not is_event_stream(self._resp_headers):
            take_not_a_stream(self.out, self._resp_headers, bytes(self._head))
        else:
            take_completion(self.out, bytes(self._head), self._over, self.bounds)
        self._reading = ""

    def context(self) -> TurnContext:
        """What the checkers judge of this exchange."""
        return request_context(self.body, self.out)


def headers_charset(headers: httpx.Headers) -> str:
    """The charset of the Content-Type where Python knows it, else UTF-8, as httpx's
    Response.encoding resolves it for client.py."""
    for param in headers.get("content-type", "").split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset" and value.strip():
            try:
                return codecs.lookup(value.strip().strip('"')).name
            except LookupError:
                break
    return "utf-8"


class ProxyRun:
    """The run folder of one proxy run: every exchange's turn record, per-session numbering,
    and the lifecycle events that make it a history `dsv4bench report` reads."""

    def __init__(self, out: Path, run_info: dict[str, Any], api_key: str | None = None,
                 on_turn: Callable[[TurnRecord], None] | None = None, capture: bool = False) -> None:
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        self.run_id = f"{stamp}-proxy-{secrets.token_hex(2)}"
        self.run_dir = out / self.run_id
        self.secrets = LearntSecrets([api_key])
        info = {"run": self.run_id, **run_info, "started": dt.datetime.now(dt.timezone.utc).isoformat()}
        self.history = HistoryWriter(self.run_dir, info, self.secrets)
        self.on_turn = on_turn
        # Every turn keeps its exact request, not only a failing one's: the run folder is then a
        # capture that `agents --replay` sends again (replay.py).
        self.capture = capture
        self.turns: dict[str, int] = {}  # session -> turns numbered so far
        self.ended = False
        self.history.event("run_start", run=self.run_id)

    def open_exchange(self, scope: Scope, headers: list[tuple[bytes, bytes]], raw_body: bytes) -> ChatExchange | None:
        """The exchange a chat-completions request starts, or None (noted as an event) for a body
        that is no JSON object: forwarded all the same, nothing to judge it by."""
        named = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in headers}
        for name, value in named.items():
            if is_secret_header(name):
                self.secrets.learn(value)
        try:
            body = json.loads(raw_body)
        except (ValueError, RecursionError):
            body = None
        if not isinstance(body, dict):
            self.history.event("unaudited_request", path=scope.get("path", ""), reason="body is not a JSON object",
                               bytes=len(raw_body))
            return None
        client = scope.get("client")
        user = body.get("user")
        session = named.get(SESSION_HEADER) or (user if isinstance(user, str) and user else None) \
            or (str(client[0]) if client else "client")
        turn = self.turns.get(session, 0)
        if turn == 0:
            self.history.event("session_start", session=session, scenario=named.get("x-dsv4bench-scenario", "proxy"))
        self.turns[session] = turn + 1
        seed = named.get("x-dsv4bench-seed", "")
        return ChatExchange(session=session, turn=turn, scenario=named.get("x-dsv4bench-scenario", "proxy"),
                            seed=int(seed) if seed.isdigit() else 0, body=body,
                            headers={k: MASK if is_secret_header(k) else v for k, v in named.items()})

    def record(self, ex: ChatExchange) -> TurnRecord | None:
        """Judge the ended exchange and write its turn record; None when it could not be built."""
        try:
            out = finish(ex.out)
            ctx = ex.context()
            verdicts, check_errors = run_checks(ctx)
            check_errors = [*ex.problems, *check_errors]
            summary = client_request_summary(ex.body)
            failing = keeps_evidence(out.status, verdicts, check_errors)
            if failing or self.capture:  # the exact request, so the turn can be replayed and audited
                summary["body"] = ex.body
                summary["headers"] = ex.headers
            rec = TurnRecord(run=self.run_id, session=ex.session, turn=ex.turn, scenario=ex.scenario, seed=ex.seed,
                             status=out.status, timings=out.timings, http_status=out.http_status, error=out.error,
                             error_kind=out.error_kind, request=summary, response=out.response, verdicts=verdicts,
                             raw_sse=out.raw_lines if failing else None, check_errors=check_errors)
        except Exception as e:  # noqa: BLE001 - a record that cannot be built is a lost record, not a crash
            self.history.event("history_write_error", session=ex.session, turn=ex.turn,
                               error=f"{type(e).__name__}: {e}"[:300])
            return None
        self.history.turn(rec)
        if self.on_turn is not None:
            self.on_turn(rec)
        return rec

    def end(self, reason: str) -> None:
        """Close the history: each session's turn count (so a lost record shows as a gap), then run_end.
        Once: a second call changes nothing."""
        if self.ended:
            return
        self.ended = True
        for session, turns in self.turns.items():
            self.history.event("session_end", session=session, reason="proxy_end", turns=turns, tool_calls=0)
        self.history.event("run_end", run=self.run_id, reason=reason)
        self.history.close()


def _forwarded(headers: list[tuple[bytes, bytes]], drop: frozenset[str]) -> list[tuple[bytes, bytes]]:
    """Headers without the hop-by-hop ones, those a Connection header names, and `drop`."""
    named = {v.strip().lower() for k, value in headers if k.lower() == b"connection"
             for v in value.decode("latin-1").split(",")}
    return [(k, v) for k, v in headers
            if (name := k.decode("latin-1").lower()) not in HOP_BY_HOP and name not in drop and name not in named]


class AuditProxy:
    """The pass-through: forwards every request to `upstream` and audits chat completions into `run`."""

    def __init__(self, upstream: str, run: ProxyRun, api_key: str | None = None) -> None:
        self.root = upstream_base(upstream)[0]
        password = httpx.URL(upstream).password
        if password:  # a password in --upstream is a secret of the run like any key
            run.secrets.learn(password)
        self.run = run
        self.api_key = api_key
        self._clients: list[httpx.AsyncClient] = []
        self._requests = 0

    def _next_client(self) -> httpx.AsyncClient:
        """The upstream client of the next request, taken in turn from a few small pools: httpcore's
        pool scans every connection it holds on each request's start and end, a cost that grows
        with the square of the streams in flight (at 80 it took more CPU than the relaying did)."""
        if not self._clients:  # made in the serving loop, the one they will run in
            # No read deadline: how long an answer may take is the client's to decide.
            timeout = httpx.Timeout(connect=10.0, read=None, write=60.0, pool=None)
            # NOTE: idle upstream connections expire before uvicorn's 5 s keep-alive (SGLang's
            # default), so a pool never reuses a socket the server is closing (driver.py).
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=64, keepalive_expiry=2.0)
            tls = httpx.create_ssl_context()  # one for all: each takes a tenth of a second to load
            self._clients = [httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False, verify=tls)
                             for _ in range(UPSTREAM_POOLS)]
        self._requests += 1
        return self._clients[self._requests % UPSTREAM_POOLS]

    async def aclose(self) -> None:
        for client in self._clients:
            await client.aclose()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            raw_body = await request.body()
        except ClientDisconnect:
            return
        headers = _forwarded(list(scope["headers"]), _SET_UPSTREAM)
        if self.api_key and not any(k.decode("latin-1").lower() in _API_KEY_HEADERS for k, _ in headers):
            headers.append((b"authorization", f"Bearer {self.api_key}".encode("latin-1")))
        exchange = None
        if request.method == "POST" and scope["path"].rstrip("/").endswith("/chat/completions"):
            try:
                exchange = self.run.open_exchange(scope, list(scope["headers"]), raw_body)
            except Exception:  # noqa: BLE001 - the audit never breaks the pass-through
                exchange = None
        path = scope.get("raw_path") or scope["path"].encode()
        query = scope.get("query_string") or b""
        url = self.root + path.decode("latin-1") + ("?" + query.decode("latin-1") if query else "")
        broke: BaseException | None = None
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._watch_client, receive, tg.cancel_scope, exchange)
                broke = await self._relay(request.method, url, headers, raw_body, send, exchange)
                tg.cancel_scope.cancel()
        except BaseException:
            if exchange is not None:
                _audit(exchange, exchange.killed, "the proxy stopped before the answer ended")
            raise
        finally:
            if exchange is not None:
                self.run.record(exchange)
        if broke is not None:
            raise UpstreamBroke(f"the upstream cut its answer: {type(broke).__name__}: {broke}") from broke

    async def _watch_client(self, receive: Receive, scope: anyio.CancelScope, exchange: ChatExchange | None) -> None:
        """A client that goes away cancels the exchange, which closes the upstream request."""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                if exchange is not None:
                    _audit(exchange, exchange.killed, "the client disconnected")
                scope.cancel()
                return

    async def _relay(self, method: str, url: str, headers: list[tuple[bytes, bytes]], body: bytes, send: Send,
                     exchange: ChatExchange | None) -> BaseException | None:
        """Forward one request and its answer; the error that broke the answer off, if one did."""
        try:
            client = self._next_client()
            resp = await client.send(client.build_request(method, url, headers=headers, content=body), stream=True)
        except httpx.HTTPError as e:
            if exchange is not None:
                _audit(exchange, exchange.unreachable, e)
            await _send_502(send, f"dsv4bench proxy: the upstream could not be reached: {type(e).__name__}: {e}")
            return None
        try:
            if exchange is not None:
                _audit(exchange, exchange.started, resp.status_code, resp.headers)
            await send({"type": "http.response.start", "status": resp.status_code,
                        "headers": _forwarded(resp.headers.raw, frozenset())})
            try:
                async for chunk in resp.aiter_raw():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    if exchange is not None:
                        _audit(exchange, exchange.chunk, chunk)
            except httpx.HTTPError as e:
                if exchange is not None:
                    _audit(exchange, exchange.broke, e)
                return e
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            if exchange is not None:
                _audit(exchange, exchange.ended)
            return None
        finally:
            with anyio.CancelScope(shield=True):
                await resp.aclose()


def _audit(exchange: ChatExchange, step: Callable[..., None], *args: Any) -> None:
    """One step of the audit; one that raises stops the audit of this exchange, never its bytes."""
    try:
        step(*args)
    except Exception as e:  # noqa: BLE001 - whatever the audit thinks, the client gets the upstream's bytes
        exchange.audit_failed(e)


async def _send_502(send: Send, message: str) -> None:
    body = json.dumps({"error": {"message": message, "type": "upstream_unreachable", "code": 502}}).encode()
    await send({"type": "http.response.start", "status": 502,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def build_app(proxy: AuditProxy) -> Starlette:
    """The Starlette app: every path and method goes to the pass-through."""

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        yield
        await proxy.aclose()

    return Starlette(routes=[Route("/{path:path}", proxy, methods=METHODS)], lifespan=lifespan)


class _QuietBreaks(logging.Filter):
    """An upstream that cut its answer is the audit's finding, not the proxy's error: no traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], UpstreamBroke))


def uvicorn_config(app: Starlette, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning") -> uvicorn.Config:
    """How uvicorn serves the proxy: no Server or Date header of its own (the upstream's pass
    through), no access log, in-flight answers given a few seconds at shutdown."""
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False, server_header=False,
                            date_header=False, timeout_graceful_shutdown=5, lifespan="on")
    logging.getLogger("uvicorn.error").addFilter(_QuietBreaks())
    return config
