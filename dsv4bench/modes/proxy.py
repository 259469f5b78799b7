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
import contextlib
import json
import logging
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_to_bytes

import aiohttp
import httpx
import uvicorn
import yarl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from dsv4bench.history.redact import MASK
from dsv4bench.loop.coarse_clock import CoarseClock, Deadline
from dsv4bench.modes.proxy_audit import Audit, InlineAudit, ProxyRun
from dsv4bench.modes.replay import HOP_BY_HOP
from dsv4bench.wire.transport import RawUpstream
from dsv4bench.wire.upstream_idle import DEFAULT_KEEPALIVE_S, IdleLearned, watch_idle

# The scope's key for the list of what to call when the client goes (_HeadTimeout).
CLIENT_GONE = "dsv4bench.client_gone"
# Set by httpx for the upstream connection itself; `expect` is answered by the proxy's own server.
_SET_UPSTREAM = frozenset({"host", "content-length", "expect"})
# The headers that carry an API key: a client that sends none gets --api-key's added.
_API_KEY_HEADERS = frozenset({"authorization", "api-key", "x-api-key"})
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
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


# A path that can only name what it says: segments of unreserved characters, none of them `.` or
# `..`, none empty (a trailing slash aside). Most requests' paths; the rest are read the long way.
_PLAIN_PATH = re.compile(rb"(?:/(?!\.\.?(?:/|$))[A-Za-z0-9._~-]+)+/?")


def upstream_path(raw_path: bytes) -> str:
    """The client's path as it is appended to the upstream's root, or Refused (400) for one that
    could name anything outside it: a dot segment, an empty segment, a slash or backslash hidden
    in an escape (decoded once or twice, as a server behind the upstream might), control
    characters, or a target that is not a plain absolute path (`http://host/x`, `*`)."""
    if _PLAIN_PATH.fullmatch(raw_path):  # letters, digits, `-_~.`, and no dot or empty segment
        return raw_path.decode("ascii")
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


class Cutoff:
    """`with Cutoff(seconds) as c:` runs its block until it ends, `seconds` pass, or `c.cut()` is
    called from elsewhere in the loop; a block cut off ends quietly, with `c.cut_off` set. The
    time is kept on the loop's CoarseClock (so it may run up to a tick over), and the cut is the
    task's own cancellation: anyio's cancel scopes and task groups, which did the same, cost the
    proxy about a tenth of a millisecond a request, and an asyncio timer each a few microseconds,
    in the burst of requests that every first chunk waits behind (bench-plan.md, "`dsv4bench
    proxy`")."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.cut_off = False
        self._task: asyncio.Task[Any] | None = None
        self._deadline: Deadline | None = None
        self._over = False

    def __enter__(self) -> Cutoff:
        self._task = asyncio.current_task()
        if self.seconds is not None:
            self._deadline = CoarseClock.of().at(self.seconds, self.cut)
        return self

    def cut(self) -> None:
        """End the block at its next suspension (from a callback or another task: never from inside it)."""
        if not self._over and not self.cut_off and self._task is not None:
            self.cut_off = True
            self._task.cancel()

    def __exit__(self, kind: type[BaseException] | None, e: BaseException | None, tb: Any) -> bool:
        self._over = True
        if self._deadline is not None:
            CoarseClock.of().drop(self._deadline)
        if self.cut_off and kind is asyncio.CancelledError:
            uncancel = getattr(self._task, "uncancel", None)  # Python 3.11+: the task's count of cancels
            if uncancel is not None:
                uncancel()
            return True
        return False


class RefusalLog:
    """The history's note of each refused request, within a budget per kind: up to BURST at once,
    then RATE a second. Why: a refusal costs a client nothing (nothing goes upstream), so a client
    that sends bad requests in a loop would otherwise write the run folder full. What the budget
    drops is counted, and said as one `events_suppressed` event per kind at most once a second,
    and at the end (`flush`)."""

    BURST = 20
    RATE = 2.0  # events a second, per kind, once the burst is spent

    def __init__(self, write: Callable[..., None], clock: Callable[[], float] = time.monotonic) -> None:
        self._write, self._clock = write, clock
        self._tokens: dict[str, float] = {}
        self._filled: dict[str, float] = {}  # when each kind's budget was last topped up
        self._dropped: dict[str, int] = {}
        self._said: dict[str, float] = {}  # when each kind's drops were last said

    def note(self, kind: str, **fields: Any) -> None:
        now = self._clock()
        tokens = min(self.BURST, self._tokens.get(kind, self.BURST) + (now - self._filled.get(kind, now)) * self.RATE)
        self._filled[kind] = now
        if tokens >= 1:
            self._tokens[kind] = tokens - 1
            self._write(kind, **fields)
            return
        self._tokens[kind] = tokens
        self._dropped[kind] = self._dropped.get(kind, 0) + 1
        if now - self._said.get(kind, -math.inf) >= 1.0:
            self._say(kind, now)

    def flush(self) -> None:
        for kind in [k for k, n in self._dropped.items() if n]:
            self._say(kind, self._clock())

    def _say(self, kind: str, now: float) -> None:
        count, self._dropped[kind] = self._dropped.get(kind, 0), 0
        self._said[kind] = now
        if count:
            self._write("events_suppressed", refusal=kind, count=count)


class UpstreamBroke(Exception):
    """The upstream cut its answer after the status line: raised out of the ASGI app so the
    server closes the client's connection too, and the client sees the same broken stream."""


def upstream_base(upstream: str) -> tuple[str, str]:
    """(where client paths are appended, the OpenAI base URL) of an --upstream given as a server's
    root or its /v1 base: http://h:p/v1 and http://h:p both forward /v1/chat/completions to
    http://h:p/v1/chat/completions; a gateway prefix before /v1 is kept."""
    root = upstream.rstrip("/")
    root = root[: -len("/v1")] if root.endswith("/v1") else root
    return root, f"{root}/v1"


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
    """The pass-through: forwards every request to `upstream` and tells `audit` of each chat
    completion (a ProxyRun is audited inline, in the serving loop)."""

    def __init__(
        self,
        upstream: str,
        audit: Audit | ProxyRun,
        api_key: str | None = None,
        limits: ProxyLimits | None = None,
    ) -> None:
        root = yarl.URL(upstream_base(upstream)[0], encoded=True)
        # Credentials in --upstream go as Basic auth on requests that carry no Authorization of
        # their own, never in the forwarded URL.
        self._basic = (
            aiohttp.BasicAuth(root.user or "", root.password or "").encode().encode("latin-1")
            if root.user is not None or root.password is not None
            else None
        )
        password = root.password
        root = root.with_user(None)
        self.root = str(root).rstrip("/")
        # Every forwarded URL must stay on this origin and under this path (checked in _target).
        self._origin = (root.scheme, root.host, root.port)
        self._prefix = root.raw_path.rstrip("/") + "/"
        self.audit: Audit = InlineAudit(audit) if isinstance(audit, ProxyRun) else audit
        if password:  # a password in --upstream is a secret of the run like any key
            self.audit.learn(password)
        self.api_key = api_key
        self.limits = limits or ProxyLimits()
        self.refusals = RefusalLog(self.audit.event)
        # What every request goes upstream on: aiohttp's client, requests sent as given, bodies
        # read raw from the socket's buffer (wire/transport.RawUpstream; its session is made on the
        # first request, in the serving loop). httpx's own transport cost about 140 µs a relayed
        # chunk and a pool scan per request that grew with the square of the streams in flight; an
        # httpx transport of any kind, a tenth of a millisecond a request (bench-plan.md,
        # "`dsv4bench proxy`"). NOTE: idle upstream connections are kept a margin under the
        # upstream's own limit, once learn_upstream_idle has seen it, and until then a second
        # under uvicorn's 5 s (SGLang's and vLLM's): so the pool never reuses a socket the server
        # is closing, and an agent that pauses between turns (a tool run, a human) finds its
        # connection still open, not a burst of connects (wire/upstream_idle.py).
        self._upstream = RawUpstream(keepalive_s=DEFAULT_KEEPALIVE_S, connect_s=10.0)

    async def learn_upstream_idle(self) -> IdleLearned:
        """Watch one idle connection to the upstream (wire/upstream_idle.py) and keep the pool's
        connections a margin under what it shows; the history notes what was learned. Runs
        beside the traffic, from the CLI: the pool keeps DEFAULT_KEEPALIVE_S until it is done."""
        # The credentials a client's request without any would be sent with (_upstream_headers).
        own = {k.decode("latin-1"): v.decode("latin-1") for k, v in self._upstream_headers([])[0]}
        learned = await watch_idle(yarl.URL(self.root + "/v1/models", encoded=True), own)
        applied = self._upstream.keep_idle(learned.keepalive_s)
        with contextlib.suppress(Exception):  # as in _refuse: the history's failure stops nothing
            self.audit.event(
                "upstream_keepalive",
                keepalive_s=round(learned.keepalive_s, 3),
                server_idle_s=None if learned.server_idle_s is None else round(learned.server_idle_s, 3),
                how=learned.how,
                applied=applied,
            )
        return learned

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):  # as in _refuse: the history's failure stops nothing
            self.refusals.flush()
        await self._upstream.aclose()

    def _target(self, scope: Scope) -> yarl.URL:
        """The upstream URL of a request: its path under the upstream's root, as the client wrote
        it (sent on as it is: nothing decodes or normalises it on the way), or Refused."""
        path = upstream_path(scope.get("raw_path") or scope["path"].encode())
        query = scope.get("query_string") or b""
        # A query's bytes as sent, those outside printable ASCII percent-encoded.
        text = "".join(chr(b) if 0x20 < b < 0x7F else f"%{b:02X}" for b in query)
        url = self.root + path + ("?" + text if text else "")
        try:
            parsed: yarl.URL | None = yarl.URL(url, encoded=True)
        except ValueError:
            parsed = None
        # However a URL parser reads it, it must still be under the root.
        if (
            parsed is None
            or (parsed.scheme, parsed.host, parsed.port) != self._origin
            or not (parsed.raw_path + "/").startswith(self._prefix)
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
        with Cutoff(self.limits.read_timeout) as deadline:
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
        assert deadline.cut_off
        raise Refused(
            408,
            "request_timeout",
            f"dsv4bench proxy: the request body did not arrive within --read-timeout ({self.limits.read_timeout:g} s)",
            bytes_seen=seen,
        )

    @staticmethod
    async def _drain(receive: Receive) -> None:
        """Read and drop what is left of a refused body, for at most DRAIN_S."""
        with Cutoff(DRAIN_S):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect" or not message.get("more_body", False):
                    return

    async def _refuse(self, send: Send, refused: Refused) -> None:
        """Answer a refused request ourselves (nothing went upstream) and note it in the history."""
        with contextlib.suppress(Exception):  # the history's failure is no reason to leave the client waiting
            self.refusals.note(refused.kind, status=refused.status, **refused.fields)
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
        if self._basic is not None and not any(k.lower() == b"authorization" for k, _ in out):
            out.append((b"authorization", self._basic))
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
            exchange = self.audit.open(
                scope["path"], client_headers, raw_body, self._client_address(scope, client_headers)
            )
        broke: BaseException | None = None
        try:
            with Cutoff(None) as relaying:
                told: list[Callable[[], None]] | None = scope.get(CLIENT_GONE)
                watcher = None
                if told is not None:  # our own server tells when the client goes
                    told.append(lambda: self._client_left(relaying, exchange))
                else:  # another ASGI server: a task waits for `receive` to say so
                    watcher = asyncio.get_running_loop().create_task(self._watch_client(receive, relaying, exchange))
                try:
                    broke = await self._relay(method, url, headers, raw_body, send, exchange, mask)
                finally:
                    if told is not None:
                        told.clear()  # a connection closed after this answer is not this turn's
                    if watcher is not None:
                        watcher.cancel()
        except BaseException:
            if exchange is not None:
                self.audit.killed(exchange, "the proxy stopped before the answer ended")
            raise
        finally:
            if exchange is not None:
                self.audit.close(exchange)
        if broke is not None:
            raise UpstreamBroke(f"the upstream cut its answer: {type(broke).__name__}: {broke}") from broke

    def _client_left(self, relaying: Cutoff, exchange: Any) -> None:
        """A client that goes away cancels the exchange, which closes the upstream request."""
        if exchange is not None:
            self.audit.killed(exchange, "the client disconnected")
        relaying.cut()

    async def _watch_client(self, receive: Receive, relaying: Cutoff, exchange: Any) -> None:
        """`_client_left` once `receive` says the client went. A receive that fails (the
        connection's state torn down under it) counts as the client gone."""
        while True:
            try:
                message = await receive()
            except Exception:  # noqa: BLE001 - nothing more can come from this client
                message = {"type": "http.disconnect"}
            if message["type"] == "http.disconnect":
                self._client_left(relaying, exchange)
                return

    async def _relay(
        self,
        method: str,
        url: yarl.URL,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        send: Send,
        exchange: Any,
        mask: KeyMask | None,
    ) -> BaseException | None:
        """Forward one request and its answer; the error that broke the answer off, if one did."""
        try:
            resp = await self._upstream.send(method, url, headers, body)
        except httpx.HTTPError as e:
            if exchange is not None:
                self.audit.unreachable(exchange, e)
            message = f"dsv4bench proxy: the upstream could not be reached: {type(e).__name__}: {e}"
            await _send_error(send, 502, "upstream_unreachable", message)
            return None
        try:
            if exchange is not None:
                self.audit.started(exchange, resp.status, resp.headers)
            out_headers = _forwarded(resp.headers, frozenset())
            if mask is not None:
                out_headers = [(k, mask.header(v)) for k, v in out_headers]
            await send({"type": "http.response.start", "status": resp.status, "headers": out_headers})
            try:
                async for chunk in resp.reads():
                    if mask is not None:
                        chunk = mask.chunk(chunk)
                        if not chunk:
                            continue
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    if exchange is not None:
                        self.audit.chunk(exchange, chunk)
            except httpx.HTTPError as e:
                if exchange is not None:
                    self.audit.broke(exchange, e)
                return e
            rest = mask.rest() if mask is not None else b""
            if rest and exchange is not None:
                self.audit.chunk(exchange, rest)
            await send({"type": "http.response.body", "body": rest, "more_body": False})
            if exchange is not None:
                self.audit.ended(exchange)
            return None
        finally:
            resp.close()  # never suspends, so no cancellation can cut it short


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
    on each request's head, and word to the app when its client goes. uvicorn times only the idle
    wait after an answer, and forgets even that at a request's first byte, so a client that sends
    nothing on a new connection, or trickles its head a byte at a time, would hold it for ever.
    The clock starts when the connection opens and again when an answer ends; the whole head must
    be in by `head_timeout` (the body's own deadline is the app's: AuditProxy._read_body). It is
    kept on the loop's CoarseClock: one timer for every connection, not one each.

    Each request's scope carries a list under CLIENT_GONE: what is in it is called when the
    connection is lost before the answer ended, so the app learns of a client that left without
    a task of its own waiting on `receive` (about 10 µs a request, bench-plan.md)."""

    head_timeout = ProxyLimits.read_timeout
    _head_deadline: Deadline | None = None
    _waiting_past: object = None  # the request cycle that was current when the clock started

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # uvicorn's own narrowing
        super().connection_made(transport)
        self._start_head_clock()

    def _start_head_clock(self) -> None:
        self._stop_head_clock()
        self._waiting_past = self.cycle
        self._head_deadline = CoarseClock.of(self.loop).at(self.head_timeout, self._head_late)

    def _stop_head_clock(self) -> None:
        if self._head_deadline is not None:
            CoarseClock.of(self.loop).drop(self._head_deadline)
            self._head_deadline = None

    def on_headers_complete(self) -> None:
        super().on_headers_complete()  # a new request's head is in: its cycle is made
        if self.cycle is not None:
            self.cycle.scope[CLIENT_GONE] = []  # type: ignore[literal-required]  # this server's own extension
            if not self.url.startswith(b"/"):
                # uvicorn keeps only the path of a target in absolute form (`http://host/x`): the
                # target as sent, so upstream_path refuses it as it refuses every other escape.
                self.cycle.scope["raw_path"] = self.url
        if self.cycle is not self._waiting_past:
            self._stop_head_clock()

    def on_response_complete(self) -> None:
        # A pipelined request's head is in already (its cycle waits in `pipeline`): no clock for it.
        if not self.pipeline:
            self._start_head_clock()
        super().on_response_complete()

    def _head_late(self) -> None:
        self._head_deadline = None
        if self.transport.is_closing() or self.cycle is not self._waiting_past:
            return
        if self.cycle is None or self.cycle.response_complete:  # nothing being answered: a 408 the client may read
            self.transport.write(b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n")
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_clock()
        cycle = self.cycle
        super().connection_lost(exc)
        if cycle is not None and not cycle.response_complete:
            for told in cycle.scope.get(CLIENT_GONE, ()):  # type: ignore[attr-defined]  # this server's own extension
                try:
                    told()
                except Exception:  # one listener's failure must not keep the next from hearing
                    logging.getLogger(__name__).exception("dsv4bench proxy: a client-gone listener failed")


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
