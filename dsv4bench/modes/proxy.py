"""`dsv4bench proxy`: an OpenAI-compatible pass-through that audits a user's own agent live.

Every request is forwarded to the upstream server over the transport `agents` uses
(wire/transport.py: aiohttp's HTTP parsing in C), served to clients by uvicorn's httptools
protocol, and the upstream's status, headers (hop-by-hop ones excepted) and body bytes go back
to the client unchanged, each chunk written the moment it arrives and only then audited. A chat
completion's bytes are fed, as the client gets them, to the same sans-IO reading `agents` uses
(turn_answer.py); when the exchange ends it becomes one TurnRecord judged by the same checkers
and written to the same history format, so `dsv4bench report` reads a proxy's run folder as it
reads any other.

The audit never stands in the way: a checker that fails, a body the reader cannot decode or
a history write that fails costs the record, never the client's bytes. A client that goes away
closes the upstream request (the turn is `killed`); an upstream that cannot be reached is a
502 to the client and a `connection_error` turn in the history.

The proxy is a service on the user's machine that holds the user's key, so it guards itself
(ProxyLimits): a request body over --max-body is a 413 and an event, never read past the cap;
a request head or body that does not arrive within --read-timeout closes the connection;
connections over --max-connections are answered 503; a path that would leave the upstream's
base path (dot segments, encoded slashes, backslashes) is a 400 sent nowhere; upstream gets the
client's own headers only (plus the key, where documented), and an upstream that echoes the
key never hands it back to a client.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import datetime as dt
import json
import logging
import secrets
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote_to_bytes

import anyio
import httpx
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from dsv4bench.wire.charset import Charset
from dsv4bench.checks import run_checks
from dsv4bench.history.run_folder import HistoryWriter
from dsv4bench.history.records import TurnContext, TurnRecord, TurnStatus
from dsv4bench.history.redact import MASK, Redactor
from dsv4bench.modes.replay import HOP_BY_HOP
from dsv4bench.harness.turn_judge import client_request_summary, keeps_evidence, request_context
from dsv4bench.wire.stream_reader import DEFAULT_BOUNDS, StreamBounds
from dsv4bench.wire.transport import AiohttpTransport, raw_reads
from dsv4bench.wire.turn_answer import (
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
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
# A request body at most this large is kept whole in a failing (or --capture) turn's record; a
# larger one keeps its size and an excerpt of its start, so a turn line stays a bounded size.
RECORDED_BODY_BYTES = 2 << 20
RECORDED_EXCERPT_CHARS = 4096
# A key shorter than this could be any word of an answer: masking it would rewrite answers.
MIN_MASKED_KEY = 8
# After a refused body (413) the rest the client is still sending is read and dropped for at most
# this long: a client that is still writing when the connection closes gets a reset, not the 413.
DRAIN_S = 1.0


@dataclass(frozen=True)
class ProxyLimits:
    """What the proxy accepts from its clients (`dsv4bench proxy --help` documents each)."""

    max_body: int = 16 << 20  # bytes of one request body
    read_timeout: float = 30.0  # seconds for a request's head, and again for its body
    max_connections: int = 256  # open client connections; more are answered 503
    keep_alive: int = 5  # seconds an idle connection is kept between requests
    trust_forwarded: bool = False  # the client address from X-Forwarded-For's last hop


class Refused(Exception):
    """A request the proxy answers itself, sending nothing upstream: its status and why."""

    def __init__(self, status: int, kind: str, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.status, self.kind, self.fields = status, kind, fields


def upstream_path(raw_path: bytes) -> str:
    """The client's path as it is appended to the upstream's root, or Refused (400) for one that
    could name anything outside it: a dot segment, an empty segment, a slash or backslash hidden
    in an escape (decoded once or twice, as a server behind the upstream might), control
    characters, or a target that is not a plain absolute path (`http://host/x`, `*`)."""
    try:
        text = raw_path.decode("ascii")
    except UnicodeDecodeError:
        text = ""
    bad = not text.startswith("/") or any(c in "\\#" or ord(c) < 0x21 or ord(c) == 0x7F for c in text)
    segments = text[1:].split("/")
    if segments[-1] == "":  # `/` itself, or a trailing slash: no segment of its own
        segments.pop()
    for segment in segments if not bad else []:
        seen = segment.encode()
        for _ in range(3):  # as sent, decoded once, decoded twice
            if seen in (b"", b".", b"..") or b"/" in seen or b"\\" in seen or any(c < 0x20 or c == 0x7F for c in seen):
                bad = True
                break
            seen = unquote_to_bytes(seen)
        if bad:
            break
    if bad:
        raise Refused(
            400,
            "path_refused",
            "dsv4bench proxy: this path could leave the upstream's base path; "
            "paths with dot or empty segments, backslashes or encoded slashes are not forwarded",
            path=text[:200] if text else repr(raw_path[:200]),
        )
    return text


class KeyMask:
    """The operator's key taken out of what an upstream answers, so a route that echoes a request's
    headers never hands the key to a client. In the body each occurrence becomes as many `*`, so a
    Content-Length stays true; a chunk that ends in what could be the key's start keeps those bytes
    until the next chunk tells (only those: an SSE event's end is never held back)."""

    def __init__(self, key: str) -> None:
        self.key = key.encode("latin-1", "replace")
        self.stars = b"*" * len(self.key)
        self._held = b""

    def header(self, value: bytes) -> bytes:
        return value.replace(self.key, MASK.encode())

    def chunk(self, data: bytes) -> bytes:
        data = (self._held + data).replace(self.key, self.stars)
        self._held = b""
        # The longest end of `data` that the key starts with, shorter than the key (a whole one was masked).
        start = max(0, len(data) - len(self.key) + 1)
        i = data.find(self.key[:1], start)
        while i != -1:
            if self.key.startswith(data[i:]):
                self._held = data[i:]
                return data[:i]
            i = data.find(self.key[:1], i + 1)
        return data

    def rest(self) -> bytes:
        """The bytes held at the body's end: the start of the key, never the whole of it."""
        held, self._held = self._held, b""
        return held


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
    body_bytes: int = 0  # the request body's size
    excerpt: str = ""  # the start of a body over RECORDED_BODY_BYTES, kept in its place
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
            self.problems.append(
                f"Content-Encoding {headers.get('content-encoding', '')[:40]!r}: the proxy "
                "cannot read it; the answer passed through unjudged"
            )
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
                del self._head[self._limit :]
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

    def __init__(
        self,
        out: Path,
        run_info: dict[str, Any],
        api_key: str | None = None,
        on_turn: Callable[[TurnRecord], None] | None = None,
        capture: bool = False,
    ) -> None:
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

    def open_exchange(
        self, scope: Scope, headers: list[tuple[bytes, bytes]], raw_body: bytes, address: str | None = None
    ) -> ChatExchange | None:
        """The exchange a chat-completions request starts, or None (noted as an event) for a body
        that is no JSON object: forwarded all the same, nothing to judge it by. `address` names the
        client (AuditProxy._client_address); the socket's peer when not given."""
        named = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in headers}
        for name, value in named.items():
            if is_secret_header(name):
                self.secrets.learn(value)
        try:
            body = json.loads(raw_body)
        except (ValueError, RecursionError):
            body = None
        if not isinstance(body, dict):
            self.history.event(
                "unaudited_request", path=scope.get("path", ""), reason="body is not a JSON object", bytes=len(raw_body)
            )
            return None
        client = scope.get("client")
        address = address or (str(client[0]) if client else None)
        user = body.get("user")
        session = named.get(SESSION_HEADER) or (user if isinstance(user, str) and user else None) or address or "client"
        turn = self.turns.get(session, 0)
        if turn == 0:
            self.history.event("session_start", session=session, scenario=named.get("x-dsv4bench-scenario", "proxy"))
        self.turns[session] = turn + 1
        seed = named.get("x-dsv4bench-seed", "")
        return ChatExchange(
            session=session,
            turn=turn,
            scenario=named.get("x-dsv4bench-scenario", "proxy"),
            seed=int(seed) if seed.isdigit() else 0,
            body=body,
            headers={k: MASK if is_secret_header(k) else v for k, v in named.items()},
            body_bytes=len(raw_body),
            excerpt=raw_body[:RECORDED_EXCERPT_CHARS].decode("utf-8", "replace")
            if len(raw_body) > RECORDED_BODY_BYTES
            else "",
        )

    def record(self, ex: ChatExchange) -> TurnRecord | None:
        """Judge the ended exchange and write its turn record; None when it could not be built."""
        try:
            out = finish(ex.out)
            ctx = ex.context()
            verdicts, check_errors = run_checks(ctx)
            check_errors = [*ex.problems, *check_errors]
            summary = client_request_summary(ex.body)
            failing = keeps_evidence(out.status, verdicts, check_errors)
            if (failing or self.capture) and ex.body_bytes > RECORDED_BODY_BYTES:
                # Too large to keep whole in every failing turn's line: its size and start only.
                summary["body_bytes"], summary["body_excerpt"] = ex.body_bytes, ex.excerpt
                summary["headers"] = ex.headers
            elif failing or self.capture:  # the exact request, so the turn can be replayed and audited
                summary["body"] = ex.body
                summary["headers"] = ex.headers
            rec = TurnRecord(
                run=self.run_id,
                session=ex.session,
                turn=ex.turn,
                scenario=ex.scenario,
                seed=ex.seed,
                status=out.status,
                timings=out.timings,
                http_status=out.http_status,
                error=out.error,
                error_kind=out.error_kind,
                request=summary,
                response=out.response,
                verdicts=verdicts,
                raw_sse=out.raw_lines if failing else None,
                check_errors=check_errors,
            )
        except Exception as e:  # noqa: BLE001 - a record that cannot be built is a lost record, not a crash
            self.history.event(
                "history_write_error", session=ex.session, turn=ex.turn, error=f"{type(e).__name__}: {e}"[:300]
            )
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
    named = {
        v.strip().lower()
        for k, value in headers
        if k.lower() == b"connection"
        for v in value.decode("latin-1").split(",")
    }
    return [
        (k, v)
        for k, v in headers
        if (name := k.decode("latin-1").lower()) not in HOP_BY_HOP and name not in drop and name not in named
    ]


class AuditProxy:
    """The pass-through: forwards every request to `upstream` and audits chat completions into `run`."""

    def __init__(
        self, upstream: str, run: ProxyRun, api_key: str | None = None, limits: ProxyLimits | None = None
    ) -> None:
        self.root = upstream_base(upstream)[0]
        root = httpx.URL(self.root)
        # Every forwarded URL must stay on this origin and under this path (checked in _target).
        self._origin = (root.scheme, root.host, root.port)
        self._prefix = root.raw_path.rstrip(b"/") + b"/"
        password = root.password
        if password:  # a password in --upstream is a secret of the run like any key
            run.secrets.learn(password)
        self.run = run
        self.api_key = api_key
        self.limits = limits or ProxyLimits()
        self._transport: AiohttpTransport | None = None
        self._timeout = httpx.Timeout(connect=10.0, read=None, write=60.0, pool=None).as_dict()

    def _upstream(self) -> AiohttpTransport:
        """What every request goes upstream on: the transport `agents` uses (aiohttp's HTTP parsing
        in C, bodies read straight from the socket's buffer: wire/transport.py), called directly,
        not through an httpx client, whose redirects, auth and cookie jar the proxy never uses (a
        client's Set-Cookie goes back to it, and a client's Cookie header upstream, untouched).
        httpx's own transport cost about 140 µs a relayed chunk and a pool scan per request that
        grew with the square of the streams in flight (bench-plan.md, "`dsv4bench proxy`")."""
        if self._transport is None:
            # NOTE: idle upstream connections expire before uvicorn's 5 s keep-alive (SGLang's
            # default), so the pool never reuses a socket the server is closing (driver.py).
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=256, keepalive_expiry=2.0)
            self._transport = AiohttpTransport(limits)
        return self._transport

    async def aclose(self) -> None:
        if self._transport is not None:
            await self._transport.aclose()

    def _target(self, scope: Scope) -> httpx.URL:
        """The upstream URL of a request: its path under the upstream's root, or Refused."""
        path = upstream_path(scope.get("raw_path") or scope["path"].encode())
        query = scope.get("query_string") or b""
        url = self.root + path + ("?" + query.decode("latin-1") if query else "")
        try:
            parsed = httpx.URL(url)
        except httpx.InvalidURL:
            parsed = None
        # Whatever httpx makes of it (it resolves dot segments), it must still be under the root.
        if (
            parsed is None
            or (parsed.scheme, parsed.host, parsed.port) != self._origin
            or not (parsed.raw_path + b"/").startswith(self._prefix)
        ):
            raise Refused(
                400, "path_refused", "dsv4bench proxy: this path would leave the upstream's base path", path=path[:200]
            )
        return parsed

    def _client_address(self, scope: Scope, headers: list[tuple[bytes, bytes]]) -> str | None:
        """Who sent the request: the socket's peer, or with --trust-forwarded the last hop that
        X-Forwarded-For names (the one the proxy in front of this one added)."""
        if self.limits.trust_forwarded:
            hops = [
                h.strip() for k, v in headers if k.lower() == b"x-forwarded-for" for h in v.decode("latin-1").split(",")
            ]
            if hops and hops[-1]:
                return hops[-1][:100]
        client = scope.get("client")
        return str(client[0]) if client else None

    async def _read_body(self, receive: Receive, headers: list[tuple[bytes, bytes]]) -> bytes:
        """The request body, read as it comes and never past --max-body; Refused for one over the
        cap (413) or not in within --read-timeout of its head (408); ClientDisconnect if the client left."""
        cap = self.limits.max_body
        declared = next((v for k, v in headers if k.lower() == b"content-length"), b"")
        if declared.strip().isdigit() and int(declared) > cap:  # said up front: not one byte of it is kept
            await self._drain(receive)
            raise Refused(
                413,
                "request_too_large",
                f"dsv4bench proxy: the request body is over --max-body ({cap} bytes)",
                bytes_seen=int(declared),
                max_body=cap,
                declared=True,
            )
        parts: list[bytes] = []
        seen = 0
        with anyio.move_on_after(self.limits.read_timeout) as deadline:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise ClientDisconnect()
                chunk = message.get("body", b"")
                seen += len(chunk)
                if seen > cap:
                    parts.clear()
                    await self._drain(receive)
                    raise Refused(
                        413,
                        "request_too_large",
                        f"dsv4bench proxy: the request body is over --max-body ({cap} bytes)",
                        bytes_seen=seen,
                        max_body=cap,
                        declared=False,
                    )
                if chunk:
                    parts.append(chunk)
                if not message.get("more_body", False):
                    return b"".join(parts)
        assert deadline.cancelled_caught
        raise Refused(
            408,
            "request_timeout",
            f"dsv4bench proxy: the request body did not arrive within --read-timeout ({self.limits.read_timeout:g} s)",
            bytes_seen=seen,
        )

    @staticmethod
    async def _drain(receive: Receive) -> None:
        """Read and drop what is left of a refused body, for at most DRAIN_S."""
        with anyio.move_on_after(DRAIN_S):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect" or not message.get("more_body", False):
                    return

    async def _refuse(self, send: Send, refused: Refused) -> None:
        """Answer a refused request ourselves (nothing went upstream) and note it in the history."""
        with contextlib.suppress(Exception):  # the history's failure is no reason to leave the client waiting
            self.run.history.event(refused.kind, status=refused.status, **refused.fields)
        body = json.dumps({"error": {"message": str(refused), "type": refused.kind, "code": refused.status}}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": refused.status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body, "more_body": False})

    def _upstream_headers(self, headers: list[tuple[bytes, bytes]]) -> tuple[list[tuple[bytes, bytes]], bool]:
        """The headers sent upstream: the client's own, less hop-by-hop ones and those httpx sets
        for its own connection; with --api-key, the key when the client sent no key of its own.
        Such a request drops the client's Accept-Encoding, so the answer comes uncompressed and an
        echoed key can be masked in it. Whether the key was added."""
        out = _forwarded(headers, _SET_UPSTREAM)
        if not self.api_key or any(k.decode("latin-1").lower() in _API_KEY_HEADERS for k, _ in out):
            return out, False
        out = [(k, v) for k, v in out if k.lower() != b"accept-encoding"]
        out.append((b"authorization", f"Bearer {self.api_key}".encode("latin-1", "replace")))
        return out, True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        client_headers = list(scope["headers"])
        try:
            url = self._target(scope)
            raw_body = await self._read_body(receive, client_headers)
        except Refused as refused:
            await self._refuse(send, refused)
            return
        except ClientDisconnect:
            return
        method = scope["method"]
        headers, key_added = self._upstream_headers(client_headers)
        mask = KeyMask(self.api_key) if key_added and self.api_key and len(self.api_key) >= MIN_MASKED_KEY else None
        exchange = None
        if method == "POST" and scope["path"].rstrip("/").endswith("/chat/completions"):
            try:
                exchange = self.run.open_exchange(
                    scope, client_headers, raw_body, self._client_address(scope, client_headers)
                )
            except Exception:  # noqa: BLE001 - the audit never breaks the pass-through
                exchange = None
        broke: BaseException | None = None
        try:
            # NOTE: a cancel scope and a bare task, not a task group: the same cancellation for a
            # fifth of the cost per request (bench-plan.md, "`dsv4bench proxy`").
            with anyio.CancelScope() as relaying:
                watcher = asyncio.get_running_loop().create_task(self._watch_client(receive, relaying, exchange))
                try:
                    broke = await self._relay(method, url, headers, raw_body, send, exchange, mask)
                finally:
                    watcher.cancel()
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
        """A client that goes away cancels the exchange, which closes the upstream request. A
        receive that fails (the connection's state torn down under it) counts as the client gone."""
        while True:
            try:
                message = await receive()
            except Exception:  # noqa: BLE001 - nothing more can come from this client
                message = {"type": "http.disconnect"}
            if message["type"] == "http.disconnect":
                if exchange is not None:
                    _audit(exchange, exchange.killed, "the client disconnected")
                scope.cancel()
                return

    async def _relay(
        self,
        method: str,
        url: httpx.URL,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        send: Send,
        exchange: ChatExchange | None,
        mask: KeyMask | None,
    ) -> BaseException | None:
        """Forward one request and its answer; the error that broke the answer off, if one did."""
        try:
            # A Request of our own, not a client's: a client adds httpx's default Accept,
            # Accept-Encoding, User-Agent and Connection headers the client never sent.
            request = httpx.Request(method, url, headers=headers, content=body, extensions={"timeout": self._timeout})
            resp = await self._upstream().handle_async_request(request)
        except httpx.HTTPError as e:
            if exchange is not None:
                _audit(exchange, exchange.unreachable, e)
            message = f"dsv4bench proxy: the upstream could not be reached: {type(e).__name__}: {e}"
            await _send_error(send, 502, "upstream_unreachable", message)
            return None
        try:
            if exchange is not None:
                _audit(exchange, exchange.started, resp.status_code, resp.headers)
            out_headers = _forwarded(resp.headers.raw, frozenset())
            if mask is not None:
                out_headers = [(k, mask.header(v)) for k, v in out_headers]
            await send({"type": "http.response.start", "status": resp.status_code, "headers": out_headers})
            try:
                async for chunk in raw_reads(resp) or resp.aiter_raw():
                    if mask is not None:
                        chunk = mask.chunk(chunk)
                        if not chunk:
                            continue
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    if exchange is not None:
                        _audit(exchange, exchange.chunk, chunk)
            except httpx.HTTPError as e:
                if exchange is not None:
                    _audit(exchange, exchange.broke, e)
                return e
            rest = mask.rest() if mask is not None else b""
            if rest and exchange is not None:
                _audit(exchange, exchange.chunk, rest)
            await send({"type": "http.response.body", "body": rest, "more_body": False})
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


async def _send_error(send: Send, status: int, kind: str, message: str, allow: list[str] | None = None) -> None:
    """An answer of the proxy's own, in the OpenAI error shape."""
    body = json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if allow:
        headers.append((b"allow", ", ".join(allow).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def build_app(proxy: AuditProxy) -> ASGIApp:
    """The ASGI app: every request of every method goes to the pass-through, straight from uvicorn
    (a router and middleware in between cost a function call or three on each relayed chunk and
    decided nothing); the lifespan's end closes the upstream client."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if scope["method"] in METHODS:
                await proxy(scope, receive, send)
            else:  # CONNECT, TRACE, made-up verbs: nothing an OpenAI-compatible server answers
                await _send_error(send, 405, "method_not_allowed", "dsv4bench proxy: method not allowed", METHODS)
        elif scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
            await proxy.aclose()
            await send({"type": "lifespan.shutdown.complete"})

    return app


class _QuietBreaks(logging.Filter):
    """An upstream that cut its answer is the audit's finding, not the proxy's error: no traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], UpstreamBroke))


class _HeadTimeout(HttpToolsProtocol):
    """uvicorn's httptools protocol (HTTP parsed in C, as llhttp parses it for Node) with a deadline
    on each request's head: uvicorn times only the idle wait after an answer, and forgets even that
    at a request's first byte, so a client that sends nothing on a new connection, or trickles its
    head a byte at a time, would hold it for ever. The clock starts when the connection opens and
    again when an answer ends; the whole head must be in by `head_timeout` (the body's own
    deadline is the app's: AuditProxy._read_body)."""

    head_timeout = ProxyLimits.read_timeout
    _head_timer: asyncio.TimerHandle | None = None
    _waiting_past: object = None  # the request cycle that was current when the clock started

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # uvicorn's own narrowing
        super().connection_made(transport)
        self._start_head_clock()

    def _start_head_clock(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._waiting_past = self.cycle
        self._head_timer = self.loop.call_later(self.head_timeout, self._head_late)

    def on_headers_complete(self) -> None:
        super().on_headers_complete()  # a new request's head is in: its cycle is made
        if not self.url.startswith(b"/") and self.cycle is not None:
            # uvicorn keeps only the path of a target in absolute form (`http://host/x`): the
            # target as sent, so upstream_path refuses it as it refuses every other escape.
            self.cycle.scope["raw_path"] = self.url
        if self._head_timer is not None and self.cycle is not self._waiting_past:
            self._head_timer.cancel()
            self._head_timer = None

    def on_response_complete(self) -> None:
        # A pipelined request's head is in already (its cycle waits in `pipeline`): no clock for it.
        if not self.pipeline:
            self._start_head_clock()
        super().on_response_complete()

    def _head_late(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self.cycle is not self._waiting_past:
            return
        if self.cycle is None or self.cycle.response_complete:  # nothing being answered: a 408 the client may read
            self.transport.write(b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n")
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)


def uvicorn_config(
    app: ASGIApp,
    host: str = "127.0.0.1",
    port: int = 0,
    log_level: str = "warning",
    limits: ProxyLimits | None = None,
) -> uvicorn.Config:
    """How uvicorn serves the proxy: no Server or Date header of its own (the upstream's pass
    through), no access log, in-flight answers given a few seconds at shutdown; the limits of
    `limits` (ProxyLimits), and no X-Forwarded-For read by uvicorn (AuditProxy reads it only when
    told to trust it)."""
    limits = limits or ProxyLimits()
    protocol = type("ProxyHttpProtocol", (_HeadTimeout,), {"head_timeout": limits.read_timeout})
    # uvicorn answers 503 once its connections reach limit_concurrency, this one counted: +1 lets
    # `max_connections` be served.
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        server_header=False,
        date_header=False,
        timeout_graceful_shutdown=5,
        lifespan="on",
        http=protocol,
        proxy_headers=False,
        limit_concurrency=limits.max_connections + 1,
        timeout_keep_alive=limits.keep_alive,
    )
    logging.getLogger("uvicorn.error").addFilter(_QuietBreaks())
    return config
