"""wire/upstream_idle: the upstream's idle limit learned from one watched connection, and the
proxy's pool held a margin under it."""

from __future__ import annotations

import asyncio

import pytest
import uvicorn
import yarl

from dsv4bench.wire.upstream_idle import (
    DEFAULT_KEEPALIVE_S,
    KEEPALIVE_MAX_S,
    keepalive_for,
    watch_idle,
)
from dsv4bench.engine.launcher import free_port
from tests.fixtures.uvicorn_thread import uvicorn_in_thread


@pytest.mark.parametrize(
    "server_idle, hold",
    [
        (None, DEFAULT_KEEPALIVE_S),
        (5.0, 4.0),
        (75.0, KEEPALIVE_MAX_S),
        (14.5, 13.5),
        (1.0, 0.5),
        (0.2, 0.1),
        (0.0, 0.0),
    ],
)
def test_the_pools_hold_is_a_margin_under_the_servers_limit(server_idle, hold):
    assert keepalive_for(server_idle) == pytest.approx(hold)


async def raw_server(head: bytes, close_after: float | None) -> tuple[asyncio.Server, yarl.URL, list[bytes]]:
    """Answers every request with a small JSON body and the extra head lines `head`; closes the
    connection after `close_after` seconds idle between requests (None: keeps it). The list:
    each request head received, the first of each connection marked by a leading b"new "."""
    heads: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        mark = b"new "
        try:
            while True:
                heads.append(mark + await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), close_after))
                mark = b""
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n" + head + b"\r\n{}"
                )
                await writer.drain()
                if b"connection: close" in head.lower():
                    break
        except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, yarl.URL(f"http://127.0.0.1:{port}/v1/models"), heads


def watched(head: bytes, close_after: float | None, watch_s: float = 5.0):
    async def main():
        server, url, _ = await raw_server(head, close_after)
        async with server:
            return await watch_idle(url, watch_s=watch_s)

    return asyncio.run(main())


def test_a_server_that_closes_idle_connections_is_timed():
    learned = watched(b"", close_after=0.6)
    assert learned.how == "closed" and learned.server_idle_s == pytest.approx(0.6, abs=0.25)
    assert learned.keepalive_s == pytest.approx(keepalive_for(learned.server_idle_s))


def test_a_keep_alive_header_is_taken_at_its_word():
    learned = watched(b"Keep-Alive: timeout=7, max=100\r\n", close_after=None)
    assert (learned.how, learned.server_idle_s, learned.keepalive_s) == ("keep-alive header", 7.0, 6.0)


def test_a_server_that_closes_after_each_answer_leaves_the_default():
    learned = watched(b"Connection: close\r\n", close_after=None)
    assert learned.server_idle_s is None and learned.keepalive_s == DEFAULT_KEEPALIVE_S
    assert "closes each connection" in learned.how


def test_a_server_that_keeps_the_connection_past_the_watch_is_held_long():
    learned = watched(b"", close_after=None, watch_s=0.5)
    assert (learned.how, learned.server_idle_s, learned.keepalive_s) == ("open past the watch", None, KEEPALIVE_MAX_S)


def test_an_upstream_that_cannot_be_asked_leaves_the_default_and_says_why():
    url = yarl.URL(f"http://127.0.0.1:{free_port()}/v1/models")
    learned = asyncio.run(watch_idle(url, watch_s=1.0))
    assert learned.keepalive_s == DEFAULT_KEEPALIVE_S and learned.server_idle_s is None
    assert learned.how.startswith("the upstream could not be asked")


def test_uvicorns_keep_alive_is_learned_from_a_real_uvicorn():
    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b"{}"})

    config = uvicorn.Config(app, "127.0.0.1", free_port(), log_level="critical", timeout_keep_alive=1)
    with uvicorn_in_thread(config) as root:
        learned = asyncio.run(watch_idle(yarl.URL(f"{root}/v1/models"), watch_s=5.0))
    assert learned.how == "closed" and learned.server_idle_s == pytest.approx(1.0, abs=0.3)
    assert learned.keepalive_s == pytest.approx(learned.server_idle_s / 2)


def test_the_proxy_keeps_its_upstream_connections_as_long_as_it_learned(tmp_path):
    from dsv4bench.history.run_folder import read_history
    from dsv4bench.modes.proxy import AuditProxy
    from dsv4bench.modes.proxy_audit import ProxyRun

    async def main():
        server, url, heads = await raw_server(b"Keep-Alive: timeout=2\r\n", close_after=None)
        run = ProxyRun(tmp_path, {"command": "dsv4bench proxy (test)", "config": {}})
        proxy = AuditProxy(str(url.with_path("/v1")), run)
        try:
            learned = await proxy.learn_upstream_idle()
            for pause in (0.0, 0.3, 1.5):  # within the learned 1 s hold, then past it
                await asyncio.sleep(pause)
                answer = await proxy._upstream.send("GET", url, [], b"")
                assert answer.status == 200
                async for _ in answer.reads():
                    pass
                answer.close()
        finally:
            await proxy.aclose()
            server.close()
            run.end("complete")
        return learned, run.run_dir, heads

    learned, run_dir, heads = asyncio.run(main())
    assert (learned.how, learned.keepalive_s) == ("keep-alive header", 1.0)
    # One connection watched, one for the first two requests, a fresh one after the pause.
    assert [h.startswith(b"new ") for h in heads] == [True, True, False, True]
    (said,) = [e for e in read_history(run_dir).events if e["kind"] == "upstream_keepalive"]
    assert said["keepalive_s"] == 1.0 and said["server_idle_s"] == 2.0 and said["applied"] is True


@pytest.mark.parametrize(
    "upstream_auth, api_key, sent",
    [
        ("", "sk-proxy-key-0451", b"authorization: Bearer sk-proxy-key-0451"),
        ("user:pw@", None, b"authorization: Basic dXNlcjpwdw=="),
        ("user:pw@", "sk-proxy-key-0451", b"authorization: Basic dXNlcjpwdw=="),  # as a forwarded request
        ("", None, None),
    ],
)
def test_the_watch_asks_with_the_credentials_a_forwarded_request_would_carry(tmp_path, upstream_auth, api_key, sent):
    from dsv4bench.modes.proxy import AuditProxy
    from dsv4bench.modes.proxy_audit import ProxyRun

    async def main():
        server, url, heads = await raw_server(b"Keep-Alive: timeout=2\r\n", close_after=None)
        run = ProxyRun(tmp_path, {"command": "dsv4bench proxy (test)", "config": {}})
        proxy = AuditProxy(f"http://{upstream_auth}127.0.0.1:{url.port}/v1", run, api_key)
        try:
            await proxy.learn_upstream_idle()
        finally:
            await proxy.aclose()
            server.close()
            run.end("complete")
        return heads

    (head,) = asyncio.run(main())
    auth = [line for line in head.lower().split(b"\r\n") if line.startswith(b"authorization:")]
    assert auth == ([sent.lower()] if sent else [])
