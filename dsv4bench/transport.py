"""httpx's API over aiohttp's HTTP/1.1 client: the transport under `agents`' httpx.AsyncClient.

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
"""

from __future__ import annotations

import asyncio
import collections
import functools
import socket
import struct
import sys
import time
import weakref
from collections.abc import AsyncGenerator, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import aiohttp
import httpx
from aiohttp.client_proto import ResponseHandler

from . import fair_loop

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
def _as_httpx_errors(request: httpx.Request) -> Iterator[None]:
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


class _Protocol(ResponseHandler):
    """aiohttp's client protocol, with arrival stamps and a lazy read timer.

    aiohttp cancels and re-creates the read timeout's timer on every read: at 250 paced streams
    that was a tenth of the harness's CPU (bench-plan.md, "Scale in one process"). Here a read
    only moves the due time; the one timer, when it fires, waits on for the rest if bytes came
    since, and times out only if none did. A shortened timeout re-arms at once.
    """

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

    def __init__(self, response: aiohttp.ClientResponse, request: httpx.Request) -> None:
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

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self._limits.max_connections or 0, limit_per_host=0,
                                             keepalive_timeout=self._limits.keepalive_expiry or 0,
                                             force_close=self._limits.max_keepalive_connections == 0,
                                             socket_factory=_stamped_socket)
            # httpx keeps the cookies and decodes the body (gzip and the rest) itself.
            # NOTE: aiohttp takes no protocol factory; its connector keeps one, which exists
            # from aiohttp 3.0 on. Without it the stamps are the reads' own times.
            if hasattr(connector, "_factory"):
                connector._factory = functools.partial(_Protocol, loop=asyncio.get_running_loop())
            self._session = aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar(),
                                                  auto_decompress=False, trust_env=False)
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeout = request.extensions.get("timeout", {})
        body = await request.aread()
        with _as_httpx_errors(request):
            response = await self._open().request(
                request.method, str(request.url), headers=request.headers.multi_items(), data=body or None,
                allow_redirects=False, compress=None, skip_auto_headers=("User-Agent", "Accept-Encoding"),
                timeout=aiohttp.ClientTimeout(total=None, connect=timeout.get("pool"),
                                              sock_connect=timeout.get("connect"), sock_read=timeout.get("read")),
            )
        body = _Body(response, request)
        return httpx.Response(response.status, headers=response.raw_headers, stream=body, request=request,
                              extensions={"http_version": b"HTTP/1.1", "reason_phrase": (response.reason or "").encode(),
                                          _ARRIVAL: body})

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
