"""httpx's API over aiohttp's HTTP/1.1 client: the transport under `agents`' httpx.AsyncClient;
and `RawUpstream`, the same reading without httpx's objects, for `dsv4bench proxy`'s upstream leg.

Per SSE chunk, httpcore + h11 cost about twice what the whole rest of a turn costs (parsing,
assembly, checkers; bench-plan.md, "Client path per chunk"); aiohttp parses HTTP in C. The
callers keep httpx's API, its timeouts and its errors: every failure below the HTTP layer
comes out as the httpx exception httpcore raises for it (names included, as they reach the
history's error text), and a response closed before its end closes its connection, so the
server sees a killed turn's disconnect, as with httpcore.

httpx-aiohttp does the same job but maps a server that disconnects to `ConnectTimeout` and
lets other aiohttp errors through unmapped, which would end a turn with an exception no
caller catches.

Two changes to aiohttp's connection protocol (`_Protocol`) matter at thousands of streams:
every read is stamped with the moment its bytes reached this host (`arrival_clock`: a first
token's stamp is when it arrived, not when a busy loop got round to reading or parsing it), and
the read timeout keeps one timer per period instead of a new one per read.

The arrival is the kernel's: on Linux each socket asks for receive timestamps
(SO_TIMESTAMPNS), and its reads take them with the bytes (`_StampedSocket`). A loop that is
busy for 10 ms when a first token lands (a burst of 250 streams' chunks, say) stamps it when it
landed, not 10 ms later (bench-plan.md, "Scale in one process"). TCP stamps a read with the
arrival of the newest bytes it returns, so a loop later than a stream's chunk interval (two
events in one read) stamps both with the second's arrival: still never earlier than the bytes.
Where the kernel gives no stamp (another OS, an event loop that reads its sockets in C), a
read is stamped when the protocol is handed its bytes, before any task runs.

The protocol is aiohttp's internal `client_proto.ResponseHandler`, which no release promises to
keep. pyproject.toml pins the aiohttp releases tested, and `seam_problems` checks, before the
first request, every internal this module overrides or calls (`SEAM`). If one is missing or
changed, the transport warns once, naming it, and serves the run over httpx's own transport
(httpcore, the client path before this module): the same turns, each chunk at more CPU, the
stamps taken when a turn's task reads its bytes (bench-plan.md, "The aiohttp seam").
"""

from __future__ import annotations

import asyncio
import collections
import functools
import inspect
import io
import socket
import struct
import sys
import time
import warnings
import weakref
from collections.abc import AsyncGenerator, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import aiohttp
import httpx
import yarl

from dsv4bench.loop import fair_loop

try:
    from aiohttp import client_proto
except ImportError:  # gone in some later aiohttp: seam_problems names it
    client_proto = None  # type: ignore[assignment]  # NOTE: getattr below reads None as "not there"

# NOTE: looked up, not imported by name, so an aiohttp without it still imports this module;
# seam_problems then names it and the run takes httpx's own transport. The stand-in base only
# lets the class below be defined: it is never made then.
ResponseHandler: type = getattr(client_proto, "ResponseHandler", asyncio.Protocol)

# Most specific first: the first class the error is an instance of decides.
_ERRORS: tuple[tuple[type[BaseException], type[httpx.TransportError]], ...] = (
    (aiohttp.ConnectionTimeoutError, httpx.ConnectTimeout),
    (aiohttp.SocketTimeoutError, httpx.ReadTimeout),
    (aiohttp.ServerTimeoutError, httpx.ReadTimeout),
    (asyncio.TimeoutError, httpx.ReadTimeout),
    (aiohttp.ClientConnectorError, httpx.ConnectError),
    (aiohttp.ServerDisconnectedError, httpx.RemoteProtocolError),
    (aiohttp.ClientPayloadError, httpx.RemoteProtocolError),
    (aiohttp.ClientResponseError, httpx.RemoteProtocolError),
    (aiohttp.InvalidURL, httpx.UnsupportedProtocol),
    (aiohttp.ClientOSError, httpx.ReadError),
    (aiohttp.ClientError, httpx.TransportError),
    (OSError, httpx.ReadError),
)


@contextmanager
def _as_httpx_errors(request: httpx.Request | None) -> Iterator[None]:
    try:
        yield
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        mapped = next(m for kind, m in _ERRORS if isinstance(e, kind))  # the table ends in both bases
        raise mapped(str(e) or type(e).__name__, request=request) from e


def _retrieve(closed: asyncio.Future[None]) -> None:
    """Take a closed-connection future's outcome, so asyncio does not report it as never retrieved."""
    if not closed.cancelled():
        closed.exception()


# Linux's SO_TIMESTAMPNS (asm-generic: the "old" option, whose stamp is a native struct
# timespec); Python's socket module does not name it.
_SO_TIMESTAMPNS = 35
_TIMESPEC = struct.Struct("@ll")
_ANCILLARY = socket.CMSG_SPACE(_TIMESPEC.size) if hasattr(socket, "CMSG_SPACE") else 0
_STAMPED: weakref.WeakValueDictionary[int, _StampedSocket] = weakref.WeakValueDictionary()  # by file descriptor


class _StampedSocket(socket.socket):
    """A TCP socket whose reads keep the kernel's receive timestamp of the bytes they return.

    asyncio's socket transport reads through `recv` (or `recv_into`); here that is `recvmsg`
    (`recvmsg_into`), which hands the stamp along (TCP gives the arrival of the newest bytes returned). The stamp is kept raw
    and read back only when a stamp is asked for."""

    __slots__ = ("_stamping", "_stamp")

    def __init__(self, family: int, type: int, proto: int) -> None:
        super().__init__(family, type, proto)
        self._stamp = b""
        try:
            self.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
            self._stamping = bool(_ANCILLARY)
        except OSError:
            self._stamping = False
        _STAMPED[self.fileno()] = self

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        if not self._stamping:
            return super().recv(bufsize, flags)
        data, ancillary, _, _ = self.recvmsg(bufsize, _ANCILLARY, flags)
        self._keep_stamp(ancillary)
        return data

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        """asyncio reads through this for a buffered protocol (TLS, whose decrypted bytes reach
        the HTTP protocol in the same callback)."""
        if not self._stamping:
            return super().recv_into(buffer, nbytes, flags)
        view = memoryview(buffer)
        n, ancillary, _, _ = self.recvmsg_into([view[:nbytes] if nbytes else view], _ANCILLARY, flags)
        self._keep_stamp(ancillary)
        return n

    def _keep_stamp(self, ancillary: list[tuple[int, int, bytes]]) -> None:
        self._stamp = b""  # a read the kernel did not stamp must not take the previous read's
        for level, kind, raw in ancillary:
            if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(raw) >= _TIMESPEC.size:
                self._stamp = raw

    def arrived_ns(self, now_ns: int) -> int:
        """The newest read's arrival on CLOCK_MONOTONIC (the kernel stamps on CLOCK_REALTIME:
        the stamp is taken as how long before now it was); `now_ns` without a usable stamp."""
        if not self._stamp:
            return now_ns
        sec, nsec = _TIMESPEC.unpack_from(self._stamp)
        ago = time.time_ns() - (sec * 1_000_000_000 + nsec)
        # NOTE: a wall clock stepped between the arrival and now would make `ago` nonsense;
        # past these bounds the read's own time stands instead.
        return now_ns - ago if 0 <= ago < 60_000_000_000 else now_ns


def _stamped_socket(addr_info: tuple) -> socket.socket:
    """aiohttp's socket factory: TCP sockets that keep receive stamps, on Linux."""
    family, kind, proto = addr_info[0], addr_info[1], addr_info[2]
    if sys.platform.startswith("linux") and kind == socket.SOCK_STREAM:
        return _StampedSocket(family, kind, proto)
    return socket.socket(family, kind, proto)


# What this module builds on inside aiohttp, beyond its public API, and why. seam_problems checks
# each; tests/test_transport.py holds the installed aiohttp to all of them by name.
_HANDLER = "aiohttp.client_proto.ResponseHandler"
SEAM: dict[str, str] = {
    _HANDLER: "the connection protocol _Protocol subclasses",
    f"{_HANDLER}.__init__(loop)": "_Protocol is made as aiohttp makes its protocol",
    f"{_HANDLER}.connection_made(transport)": "overridden: the socket whose reads carry stamps",
    f"{_HANDLER}.connection_lost(exc)": "overridden: the socket leaves the first-read set",
    f"{_HANDLER}.data_received(data)": "overridden: each read is stamped",
    f"{_HANDLER}.data_received calls _reschedule_timeout": "a read moves the lazy read timer; else it "
    "would time a live stream out",
    f"{_HANDLER}.set_response_params(*, ...)": "overridden, keywords only: a request goes out",
    f"{_HANDLER}._reschedule_timeout()": "overridden: the lazy read timer",
    f"{_HANDLER}._drop_timeout()": "called by the lazy read timer",
    f"{_HANDLER}._on_read_timeout()": "called when the read timeout is due",
    f"{_HANDLER}.closed": "a property, the future _Body fails a broken body on",
    f"{_HANDLER} instance ._payload ._read_timeout ._read_timeout_handle ._loop": "read by _Protocol",
    "aiohttp.TCPConnector(socket_factory=)": "the sockets that keep receive stamps",
    "aiohttp.TCPConnector._factory": "functools.partial(ResponseHandler, loop=...), replaced by _Protocol's",
    "aiohttp.ClientResponse.start sets ._protocol": "_Body finds the protocol of a body already all in",
    "aiohttp.StreamReader.total_bytes": "the bytes fed to a body, to match reads to their stamps",
}


def _positional(fn: Any) -> list[str] | None:
    """The names of `fn`'s parameters that can be passed by position, after self; None if any
    other kind (keyword-only, *args, **kwargs) is there."""
    try:
        params = list(inspect.signature(fn).parameters.values())[1:]
    except (TypeError, ValueError):
        return None
    if any(p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params):
        return None
    return [p.name for p in params]


def _names_used(fn: Any) -> tuple[str, ...]:
    """The attribute and global names `fn`'s own code uses (its code object's co_names)."""
    code = getattr(inspect.unwrap(fn), "__code__", None) if fn is not None else None
    return code.co_names if code is not None else ()


def seam_problems(connector: aiohttp.TCPConnector) -> dict[str, str]:
    """Each of aiohttp's internals that is missing or changed on the installed aiohttp: its name
    in SEAM, and what was found instead. `connector` is a fresh one, made in the running loop.
    Empty: _Protocol and _Body work as they were written for.
    NOTE: the checks err on the side of the fallback: a hook moved into a helper reads as gone."""
    problems: dict[str, str] = {}
    handler = getattr(client_proto, "ResponseHandler", None)
    if not isinstance(handler, type) or not issubclass(handler, asyncio.Protocol):
        problems[_HANDLER] = f"not found ({handler!r})"
    else:
        for key, name, params in (
            ("__init__(loop)", "__init__", ["loop"]),
            ("connection_made(transport)", "connection_made", ["transport"]),
            ("connection_lost(exc)", "connection_lost", ["exc"]),
            ("data_received(data)", "data_received", ["data"]),
            ("_reschedule_timeout()", "_reschedule_timeout", []),
            ("_drop_timeout()", "_drop_timeout", []),
            ("_on_read_timeout()", "_on_read_timeout", []),
        ):
            fn = getattr(handler, name, None)
            if not callable(fn):
                problems[f"{_HANDLER}.{key}"] = "not found"
            elif _positional(fn) != params:
                problems[f"{_HANDLER}.{key}"] = f"its parameters are now {inspect.signature(fn)}"
        if "_reschedule_timeout" not in _names_used(getattr(handler, "data_received", None)):
            problems[f"{_HANDLER}.data_received calls _reschedule_timeout"] = "it no longer does"
        fn = getattr(handler, "set_response_params", None)
        if not callable(fn):
            problems[f"{_HANDLER}.set_response_params(*, ...)"] = "not found"
        elif any(p.kind is not p.KEYWORD_ONLY for p in list(inspect.signature(fn).parameters.values())[1:]):
            problems[f"{_HANDLER}.set_response_params(*, ...)"] = f"its parameters are now {inspect.signature(fn)}"
        if not isinstance(inspect.getattr_static(handler, "closed", None), property):
            problems[f"{_HANDLER}.closed"] = "not a property"
        key = f"{_HANDLER} instance ._payload ._read_timeout ._read_timeout_handle ._loop"
        try:
            probe = handler(loop=asyncio.get_running_loop())  # type: ignore[call-arg]  # aiohttp's takes it; mypy sees Protocol
        except Exception as e:  # noqa: BLE001 - made as aiohttp makes it; how that fails is what changed
            problems[key] = f"{_HANDLER}(loop=...) raised {type(e).__name__}: {e}"
        else:
            missing = [
                a for a in ("_payload", "_read_timeout", "_read_timeout_handle", "_loop") if not hasattr(probe, a)
            ]
            if missing:
                problems[key] = f"no {', '.join(missing)}"
    if "socket_factory" not in inspect.signature(aiohttp.TCPConnector).parameters:
        problems["aiohttp.TCPConnector(socket_factory=)"] = "no such parameter"
    factory = getattr(connector, "_factory", None)
    if not (
        isinstance(factory, functools.partial)
        and factory.func is handler
        and not factory.args
        and set(factory.keywords) == {"loop"}
    ):
        problems["aiohttp.TCPConnector._factory"] = f"{factory!r}"
    if "_protocol" not in _names_used(getattr(aiohttp.ClientResponse, "start", None)):
        problems["aiohttp.ClientResponse.start sets ._protocol"] = "it no longer does"
    if inspect.getattr_static(aiohttp.StreamReader, "total_bytes", None) is None:
        problems["aiohttp.StreamReader.total_bytes"] = "not found"
    return problems


# The installed aiohttp's problems, checked once a process (its internals do not change while it
# runs): None until the first request.
_seam_verdict: dict[str, str] | None = None


def _check_seam(connector: aiohttp.TCPConnector) -> dict[str, str]:
    """seam_problems, once a process, with one warning when there are any."""
    global _seam_verdict
    if _seam_verdict is None:
        _seam_verdict = seam_problems(connector)
        if _seam_verdict:
            named = "; ".join(f"{name}: {found}" for name, found in _seam_verdict.items())
            warnings.warn(
                f"aiohttp {aiohttp.__version__} changed what dsv4bench's transport builds on: {named}. "
                "This run reads its answers over httpx's own transport "
                "(httpcore) instead: the same turns, more CPU per chunk, and first tokens stamped when "
                'the run reads them, not when they arrived (bench-plan.md, "The aiohttp seam"). '
                "pyproject.toml names the aiohttp releases tested.",
                RuntimeWarning,
                stacklevel=1,
            )
    return _seam_verdict


class _Protocol(ResponseHandler):
    """aiohttp's client protocol, with arrival stamps and a lazy read timer.

    aiohttp cancels and re-creates the read timeout's timer on every read: at 250 paced streams
    that was a tenth of the harness's CPU (bench-plan.md, "Scale in one process"). Here a read
    only moves the due time; the one timer, when it fires, waits on for the rest if bytes came
    since, and times out only if none did. A shortened timeout re-arms at once.
    """

    # aiohttp's attribute this class sets as well as reads (SEAM): declared for mypy, which sees
    # nothing of a base looked up at run time.
    _read_timeout_handle: asyncio.TimerHandle | None

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.arrived_ns = 0  # CLOCK_MONOTONIC when the latest bytes reached this host
        # The body being read: its reader, and per socket read that fed it, (its bytes fed so
        # far, that read's arrival), oldest first; the body's reads take their stamps from it.
        self._arrivals_of: aiohttp.StreamReader | None = None
        self._arrivals: collections.deque[tuple[int, int]] = collections.deque()
        self._read_due = 0.0
        self._socket: _StampedSocket | None = None
        self._fd = -1
        self._first = False  # read ahead of other sockets (fair_loop.read_first)
        self.exchange = 0  # the requests sent on this connection so far: the newest one's number

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        sock = transport.get_extra_info("socket")
        self._socket = _STAMPED.get(sock.fileno()) if sock is not None else None
        self._fd = sock.fileno() if sock is not None else -1
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.read_first(False)
        super().connection_lost(exc)

    def set_response_params(self, **params: Any) -> None:
        """aiohttp readies the protocol for the answer to a request it is sending: until its
        first token, this connection is read ahead of the others."""
        super().set_response_params(**params)
        self.exchange += 1
        self.read_first(True)

    def answered(self, exchange: int) -> None:
        """The answer to request number `exchange` has its first token, or its reader is done
        with it: the connection is read in turn again, unless a newer request is out on it.
        NOTE: aiohttp puts a connection back in the pool when the body's last bytes are in,
        before the reader closes the body: a reader closing late (a busy loop) must not take
        the next request's place in the queue away from it (bench-plan.md, "Scale in one process")."""
        if exchange == self.exchange:
            self.read_first(False)

    def read_first(self, first: bool) -> None:
        if first != self._first and self._fd >= 0:
            self._first = first
            fair_loop.read_first(self._fd, first)

    def data_received(self, data: bytes) -> None:
        if not data:
            super().data_received(data)
            return
        now = time.monotonic_ns()
        self.arrived_ns = self._socket.arrived_ns(now) if self._socket is not None else now
        super().data_received(data)
        payload = self._payload
        if payload is None:
            return
        if payload is not self._arrivals_of:  # a new body
            self._arrivals_of, self._arrivals = payload, collections.deque()
        fed = payload.total_bytes
        if fed and (not self._arrivals or self._arrivals[-1][0] != fed):
            self._arrivals.append((fed, self.arrived_ns))

    def arrivals_of(self, payload: aiohttp.StreamReader) -> collections.deque[tuple[int, int]] | None:
        """The arrivals of the reads that fed `payload` (data_received), while it is this
        connection's body; None once another body has followed it."""
        if payload is not self._arrivals_of:
            if self._payload is not payload:
                return None
            self._arrivals_of, self._arrivals = payload, collections.deque()  # its headers came alone
        return self._arrivals

    def _reschedule_timeout(self) -> None:
        timeout, handle = self._read_timeout, self._read_timeout_handle
        if not timeout:
            self._drop_timeout()
            return
        self._read_due = due = self._loop.time() + timeout
        if handle is not None:
            if handle.when() <= due:
                return  # it fires first and waits on from there
            handle.cancel()
        self._read_timeout_handle = self._loop.call_at(due, self._check_read_timeout)

    def _check_read_timeout(self) -> None:
        self._read_timeout_handle = None
        if not self._read_timeout:
            return
        if self._loop.time() < self._read_due:
            self._read_timeout_handle = self._loop.call_at(self._read_due, self._check_read_timeout)
        else:
            self._on_read_timeout()


_ARRIVAL = "dsv4bench.arrival"
# The request carries every header meant to go; aiohttp adds none of its own (its User-Agent,
# Accept, Accept-Encoding, a Content-Type guessed for bytes), as httpcore adds none.
_NO_AUTO_HEADERS = ("User-Agent", "Accept-Encoding", "Accept", "Content-Type")
_LARGE_BODY = 1 << 20  # aiohttp's own threshold (payload.TOO_LARGE_BYTES_BODY) for a body in one write


def _request_data(body: bytes) -> bytes | io.BytesIO | None:
    """A request body as aiohttp takes it: none when empty, and over 1 MiB a buffer it writes in
    pieces (raw bytes that large it warns about, an error under -W error)."""
    return (io.BytesIO(body) if len(body) > _LARGE_BODY else body) or None


def arrival_clock(response: httpx.Response) -> Callable[[], int]:
    """When the bytes of `response` read so far last came off the socket (CLOCK_MONOTONIC ns,
    what `time.monotonic_ns()` reads): each stamp is the arrival of the newest bytes handed on,
    never earlier than the bytes it stamps. Over another transport, the time of the call."""
    body = response.extensions.get(_ARRIVAL)
    return body.arrived if isinstance(body, _Body) else time.monotonic_ns


def first_token_read(response: httpx.Response) -> None:
    """The answer's first token is in: its connection is read in turn with the others again."""
    body = response.extensions.get(_ARRIVAL)
    if isinstance(body, _Body):
        body._awaiting_first = False
        if body._stamps is not None:
            body._stamps.answered(body._exchange)


def body_bytes(response: httpx.Response) -> AsyncGenerator[bytes, None] | None:
    """The body's reads straight from this transport, or None where httpx must read it (a
    content-encoding to undo, another transport's body).

    httpx hands a body on through four async iterators (raw, decoded, byte-chunked,
    text-chunked) that here pass each read through unchanged; at thousands of reads a second
    those hops are a tenth of the harness's time per chunk. The bytes and the errors are those
    httpx's iterators give."""
    body = response.extensions.get(_ARRIVAL)
    encoding = response.headers.get("content-encoding", "").strip().lower()
    if not isinstance(body, _Body) or encoding not in ("", "identity"):
        return None
    return body.__aiter__()


def unlink(response: httpx.Response) -> None:
    """Cut the reference cycle of a closed response, so reference counting frees it at once.

    httpx binds a response's stream to the response (its BoundAsyncStream keeps it), so every
    turn's response, request, headers and the aiohttp objects under them became cyclic garbage:
    a few dozen objects a turn, left to full collections of 40-110 ms at 50-250 sessions
    (bench-plan.md, "Scale in one process")."""
    response.stream = httpx.ByteStream(b"")
    response.extensions.pop(_ARRIVAL, None)


class _Body(httpx.AsyncByteStream):
    """A response body as aiohttp buffers it: every read hands on all that has arrived.

    NOTE: aiohttp's C parser, on a broken chunk in the middle of a body, closes the connection
    but leaves the body's reader waiting for ever (the pure-Python parser raises). So when the
    connection is lost with the body neither ended nor failed, the body fails here, as httpcore
    fails it: a turn that reads it ends with a protocol error, not at its deadline.
    """

    def __init__(self, response: aiohttp.ClientResponse, request: httpx.Request | None) -> None:
        self._response = response
        self._request = request
        self._ended = False
        self._closed: asyncio.Future[None] | None = None
        protocol = response.connection.protocol if response.connection is not None else None
        # NOTE: a body that came whole with its headers has released its connection already;
        # the response still holds the protocol it was read from (aiohttp's own attribute).
        stamped = getattr(response, "_protocol", None)
        self._stamps = stamped if isinstance(stamped, _Protocol) else None
        self._arrivals = self._stamps.arrivals_of(response.content) if self._stamps is not None else None
        self._exchange = self._stamps.exchange if self._stamps is not None else 0
        self._consumed = 0  # bytes of the body handed on
        self._awaiting_first = True  # until first_token_read: the body is handed on read by read
        self._final_ns = 0  # the arrival of the last bytes, once the body is all in
        if protocol is not None:
            closed = protocol.closed
            if closed is None:  # already lost
                self._connection_lost(None)
            else:
                self._closed = closed
                closed.add_done_callback(self._connection_lost)

    def _connection_lost(self, closed: asyncio.Future[None] | None) -> None:
        if closed is not None:
            _retrieve(closed)
        content = self._response.content
        if not content.is_eof() and content.exception() is None:
            content.set_exception(aiohttp.ClientPayloadError("the connection closed before the body ended"))

    def arrived(self) -> int:
        """See arrival_clock: the arrival of the socket read that brought the newest byte handed
        on. NOTE: not the connection's latest read: a stream's next chunk may arrive before the
        task reading the body gets to the one before it, and a first token stamped with its
        successor's arrival was a TTFT late by a chunk interval or more (bench-plan.md)."""
        arrivals = self._arrivals
        if arrivals:
            consumed = self._consumed
            while len(arrivals) > 1 and arrivals[0][0] < consumed:
                arrivals.popleft()  # reads whose bytes are all handed on
            return arrivals[0][1]
        if self._final_ns:
            return self._final_ns
        if self._stamps is None or not self._stamps.arrived_ns:
            return time.monotonic_ns()
        ns = self._stamps.arrived_ns
        if self._response.connection is None:  # all in: later reads on the connection are another body's
            self._final_ns = ns
        return ns

    async def __aiter__(self) -> AsyncGenerator[bytes, None]:
        content = self._response.content
        # NOTE: until the first token, piece by piece as the reads fed them (up to each HTTP
        # chunk's end), so the first token's piece is stamped with its own read's arrival even
        # when the next chunk is in too; after it, all that is buffered at once (each piece
        # apart costs a third more CPU per chunk when a fast server's chunks pile up), stamped
        # with the arrival of its newest bytes, never earlier than any of them
        with _as_httpx_errors(self._request):
            while self._awaiting_first:
                data, chunk_end = await content.readchunk()
                if data:
                    self._consumed += len(data)
                    yield data
                elif not chunk_end:  # the end of the body
                    self._ended = True
                    return
            while data := await content.readany():
                self._consumed += len(data)
                yield data
        self._ended = True

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        if self._stamps is not None:
            self._stamps.answered(self._exchange)
        if self._closed is not None:  # a kept-alive connection outlives this body: unhook it
            self._closed.remove_done_callback(self._connection_lost)
            self._closed.remove_done_callback(_retrieve)
            self._closed.add_done_callback(_retrieve)
        if self._ended:
            self._response.release()  # read to its end: the connection goes back to the pool
        else:
            self._response.close()  # cut short (a kill, a bound): the server sees the disconnect


class AiohttpTransport(httpx.AsyncBaseTransport):
    """An httpx transport over one aiohttp session, made on the first request (inside the loop)."""

    def __init__(self, limits: httpx.Limits = httpx.Limits()) -> None:
        self._limits = limits
        self._session: aiohttp.ClientSession | None = None
        self._public: httpx.AsyncHTTPTransport | None = None  # httpx's own, if aiohttp changed (SEAM)

    async def _open(self) -> None:
        if self._session is not None or self._public is not None:
            return
        connector = aiohttp.TCPConnector(
            limit=self._limits.max_connections or 0,
            limit_per_host=0,
            keepalive_timeout=self._limits.keepalive_expiry or 0,
            force_close=self._limits.max_keepalive_connections == 0,
            socket_factory=_stamped_socket,
        )
        if _check_seam(connector):
            # NOTE: set before the await, so the requests that come meanwhile take it too.
            self._public = httpx.AsyncHTTPTransport(limits=self._limits, trust_env=False)
            await connector.close()
            return
        # httpx keeps the cookies and decodes the body (gzip and the rest) itself.
        # NOTE: aiohttp takes no protocol factory; its connector keeps one (the seam check
        # holds it to the form replaced here).
        connector._factory = functools.partial(_Protocol, loop=asyncio.get_running_loop())  # type: ignore[assignment]  # a ResponseHandler subclass's; partial is invariant
        self._session = aiohttp.ClientSession(
            connector=connector, cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False, trust_env=False
        )

    @property
    def fallback(self) -> httpx.AsyncBaseTransport | None:
        """httpx's own transport, where the seam check found aiohttp changed (after the first
        request); None over aiohttp."""
        return self._public

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await self._open()
        if self._public is not None:
            return await self._public.handle_async_request(request)
        assert self._session is not None  # _open made one or the fallback
        timeout = request.extensions.get("timeout", {})
        content = await request.aread()
        with _as_httpx_errors(request):
            response = await self._session.request(
                request.method,
                str(request.url),
                headers=request.headers.multi_items(),
                data=_request_data(content),
                allow_redirects=False,
                compress=None,
                skip_auto_headers=_NO_AUTO_HEADERS,
                timeout=aiohttp.ClientTimeout(
                    total=None,
                    connect=timeout.get("pool"),
                    sock_connect=timeout.get("connect"),
                    sock_read=timeout.get("read"),
                ),
            )
        body = _Body(response, request)
        return httpx.Response(
            response.status,
            headers=response.raw_headers,
            stream=body,
            request=request,
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": (response.reason or "").encode(), _ARRIVAL: body},
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
        if self._public is not None:
            await self._public.aclose()


class RawAnswer:
    """An upstream's answer to a pass-through: its status, its headers as they came, and its body
    read raw (`reads`), failures raised as httpx's errors; `close` releases the connection when
    the body was read to its end and closes it otherwise, so the server sees the disconnect."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.status = response.status
        self.headers: list[tuple[bytes, bytes]] = list(response.raw_headers)
        self._body = _Body(response, None)

    def reads(self) -> AsyncGenerator[bytes, None]:
        return self._body.__aiter__()

    def close(self) -> None:
        """Release the connection (the body read to its end) or close it (cut short). Never
        suspends: a task being cancelled still gets it done."""
        self._body.close()


class RawUpstream:
    """A pass-through's upstream (`dsv4bench proxy`): each request sent exactly as given (no header
    of aiohttp's own, the path as the client wrote it), over one aiohttp session made on the first
    request (inside the serving loop). Not an httpx transport: the httpx Request, Headers and
    Response around each exchange cost a pass-through about a tenth of a millisecond a request,
    for nothing it reads (bench-plan.md, "`dsv4bench proxy`"). Failures come out as the httpx
    errors `agents` records, so a proxy's turn and an agent's read alike."""

    def __init__(self, keepalive_s: float, connect_s: float) -> None:
        self._keepalive_s = keepalive_s
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_s)
        self._session: aiohttp.ClientSession | None = None

    async def send(self, method: str, url: yarl.URL, headers: list[tuple[bytes, bytes]], body: bytes) -> RawAnswer:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=self._keepalive_s)
            self._session = aiohttp.ClientSession(
                connector=connector, cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False, trust_env=False
            )
        with _as_httpx_errors(None):
            response = await self._session.request(
                method,
                url,
                headers=[(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers],
                data=_request_data(body),
                allow_redirects=False,
                compress=None,
                skip_auto_headers=_NO_AUTO_HEADERS,
                timeout=self._timeout,
            )
        return RawAnswer(response)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()

    def keep_idle(self, seconds: float) -> bool:
        """Keep idle connections `seconds` from now on (wire/upstream_idle.py learns how long the
        upstream keeps them). Whether it took: the pool's hold is aiohttp's own attribute, read
        on each reuse and each sweep, and an aiohttp without it keeps the hold it was made with."""
        self._keepalive_s = seconds
        if self._session is None:
            return True
        connector = self._session.connector
        if not isinstance(getattr(connector, "_keepalive_timeout", None), (int, float)):
            return False
        connector._keepalive_timeout = seconds  # type: ignore[union-attr]  # aiohttp's own attribute, checked above
        return True
