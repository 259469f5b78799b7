"""How long an upstream keeps an idle connection open, learned from one connection watched idle.

A pass-through keeps its upstream connections for the next request. Kept too long, a request
can be sent on a connection the server is closing that instant, and fails though nothing was
wrong; kept too short, every pause of an agent longer than the pool's hold (a tool run, a human)
costs a fresh connection per request, and a burst of them waits on the connects: at 500 streams
that was about 40 ms more to the first chunk than a relay that kept its connections
(bench-plan.md, "`dsv4bench proxy`"). The right hold is just under the server's own, which
differs by server: uvicorn (SGLang, vLLM) closes after 5 s idle, aiohttp's server after 75 s,
Go's and many others never. What the proxy learns it writes to the history as an
`upstream_keepalive` event.

`watch_idle` asks the upstream one cheap question (GET /v1/models) on a connection of its own,
then waits for the server to close that connection: the time it stayed open is the server's
idle limit. A `Keep-Alive: timeout=N` answer says it at once; `Connection: close` says there is
nothing to keep. `keepalive_for` turns what was seen into the pool's hold, a margin under it.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

import aiohttp
import yarl

# The hold before anything is learned, or where nothing can be: a second under uvicorn's 5 s.
DEFAULT_KEEPALIVE_S = 4.0
# How long the watched connection is given to be closed, and the hold for a server that kept it
# open past that: aiohttp's own client hold is 15 s, and an agent's pause of more than that
# between turns is rare next to the turn itself.
WATCH_S = 15.0
KEEPALIVE_MAX_S = 14.0
MARGIN_S = 1.0  # how far under the server's limit the pool lets go (at most half of it)

_KEEP_ALIVE_TIMEOUT = re.compile(r"(?:^|[,\s])timeout\s*=\s*(\d+(?:\.\d+)?)", re.IGNORECASE)


@dataclass(frozen=True)
class IdleLearned:
    """What was seen of the upstream's idle connections, and the pool's hold that follows."""

    keepalive_s: float  # how long the pool keeps an idle upstream connection
    server_idle_s: float | None  # when the server closed it (or said it would); None: not seen
    how: str  # "closed", "keep-alive header", "open past the watch", or why nothing was learned


def keepalive_for(server_idle_s: float | None) -> float:
    """The pool's hold for a server that closes idle connections after `server_idle_s` (None:
    unknown): a margin under it, at most MARGIN_S and at most half of it."""
    if server_idle_s is None:
        return DEFAULT_KEEPALIVE_S
    return min(KEEPALIVE_MAX_S, max(0.0, server_idle_s - min(MARGIN_S, server_idle_s / 2)))


def _said_timeout(response: aiohttp.ClientResponse) -> float | None:
    for value in response.headers.getall("keep-alive", []):
        if m := _KEEP_ALIVE_TIMEOUT.search(value):
            return float(m.group(1))
    return None


async def watch_idle(
    url: yarl.URL, headers: dict[str, str] | None = None, watch_s: float = WATCH_S, connect_s: float = 10.0
) -> IdleLearned:
    """GET `url` on a connection of its own, read the answer, and time how long the server keeps
    the connection open after it (up to `watch_s`). Never raises for what the upstream does: an
    upstream that cannot be asked leaves the default hold, with `how` saying why."""
    connector = aiohttp.TCPConnector(limit=1, keepalive_timeout=watch_s + 5.0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_s, sock_read=30.0)
    loop = asyncio.get_running_loop()
    try:
        async with aiohttp.ClientSession(
            connector=connector, timeout=timeout, cookie_jar=aiohttp.DummyCookieJar(), trust_env=False
        ) as session:
            async with session.get(url, headers=headers or {}, allow_redirects=False) as response:
                # NOTE: the connection's protocol, read before the body: an answer that came whole
                # with its head has given its connection back already (aiohttp's own attribute).
                protocol = response.connection.protocol if response.connection is not None else None
                protocol = protocol or getattr(response, "_protocol", None)
                await response.read()
                said = _said_timeout(response)
                http_1_0 = response.version is not None and response.version < (1, 1)  # no keep-alive by default
                closes = http_1_0 or response.headers.get("connection", "").lower() == "close"
            answered = loop.time()
            if closes:
                return IdleLearned(DEFAULT_KEEPALIVE_S, None, "the upstream closes each connection after its answer")
            if said is not None:
                return IdleLearned(keepalive_for(said), said, "keep-alive header")
            closed = getattr(protocol, "closed", None)
            if not isinstance(closed, asyncio.Future):
                return IdleLearned(DEFAULT_KEEPALIVE_S, None, "the connection could not be watched")
            try:
                await asyncio.wait_for(asyncio.shield(closed), watch_s)
            except TimeoutError:
                return IdleLearned(KEEPALIVE_MAX_S, None, "open past the watch")
            idle = loop.time() - answered
            return IdleLearned(keepalive_for(idle), idle, "closed")
    except Exception as e:  # noqa: BLE001 - whatever stops the watch, the pool keeps the default hold
        return IdleLearned(DEFAULT_KEEPALIVE_S, None, f"the upstream could not be asked: {type(e).__name__}: {e}")
