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
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import aiohttp
import httpx

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

    async def __aiter__(self) -> AsyncIterator[bytes]:
        content = self._response.content
        with _as_httpx_errors(self._request):
            while data := await content.readany():
                yield data
        self._ended = True

    async def aclose(self) -> None:
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
                                             force_close=self._limits.max_keepalive_connections == 0)
            # httpx keeps the cookies and decodes the body (gzip and the rest) itself.
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
        return httpx.Response(response.status, headers=response.raw_headers, stream=_Body(response, request),
                              request=request, extensions={"http_version": b"HTTP/1.1",
                                                           "reason_phrase": (response.reason or "").encode()})

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
