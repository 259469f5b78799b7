"""With an API key every endpoint of every PD port (router, prefill, decode) needs
`Authorization: Bearer KEY`; `/health` and `/metrics` stay open unless
`ServerConfig.auth_health_metrics`. A caller without the key cannot abort a user's stream."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from dsv4bench.engine.server import ServerConfig

from .helpers import ServedPD

KEY = "sk-test-key"
GOOD = {"Authorization": f"Bearer {KEY}"}
BAD = ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}, {"Authorization": f"bearer {KEY}x"})
CHAT = {"model": "dsv4-mini", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
# (method, path, body) of every endpoint each kind of port serves, /health and /metrics aside
WORKER_ENDPOINTS = (
    ("GET", "/get_server_info", None),
    ("GET", "/health_generate", None),
    ("POST", "/abort_request", {"rid": "nobody"}),
    ("POST", "/abort_request", {"abort_all": True}),
)
ROUTER_ENDPOINTS = (
    ("POST", "/v1/chat/completions", CHAT),
    ("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2}),
    ("GET", "/v1/models", None),
    ("GET", "/get_server_info", None),
    ("GET", "/get_model_info", None),
    ("GET", "/health_generate", None),
    ("POST", "/abort_request", {"rid": "nobody"}),
    ("POST", "/flush_cache", None),
)


def serve(**cfg) -> ServedPD:
    return ServedPD(server_cfg=ServerConfig(api_key=KEY, **cfg))


@pytest.fixture(scope="module")
def keyed() -> Iterator[dict[str, str]]:
    served = serve()
    yield {name: srv.url for name, srv in served.servers.items()}
    served.stop()


def endpoints(port: str):
    return ROUTER_ENDPOINTS if port == "router" else WORKER_ENDPOINTS


@pytest.mark.parametrize("port", ["router", "prefill", "decode"])
def test_every_endpoint_of_every_port_refuses_without_the_key(keyed, port):
    for method, path, body in endpoints(port):
        for headers in BAD:
            r = httpx.request(method, keyed[port] + path, json=body, headers=headers, timeout=10)
            assert r.status_code == 401, (port, path, headers, r.status_code)
            assert r.json()["error"]["code"] == "invalid_api_key"
        # unknown paths too: no probing past the door
        assert httpx.get(keyed[port] + "/nope", timeout=10).status_code == 401


@pytest.mark.parametrize("port", ["router", "prefill", "decode"])
def test_every_endpoint_of_every_port_answers_with_the_key(keyed, port):
    for method, path, body in endpoints(port):
        if body == {"abort_all": True}:
            continue  # answered, but it would abort the other tests' requests
        r = httpx.request(method, keyed[port] + path, json=body, headers=GOOD, timeout=30)
        assert r.status_code == 200, (port, path, r.status_code, r.text[:200])
    assert httpx.get(keyed[port] + "/nope", headers=GOOD, timeout=10).status_code == 404


@pytest.mark.parametrize("port", ["router", "prefill", "decode"])
def test_health_and_metrics_are_open_by_default(keyed, port):
    for path in ("/health", "/metrics"):
        assert httpx.get(keyed[port] + path, timeout=10).status_code == 200


def test_auth_health_metrics_closes_them_too():
    served = serve(auth_health_metrics=True)
    try:
        for root in (served.router, served.prefill, served.decode):
            for path in ("/health", "/metrics"):
                assert httpx.get(root + path, timeout=10).status_code == 401
                assert httpx.get(root + path, headers=GOOD, timeout=10).status_code == 200
    finally:
        served.stop()


def test_abort_all_without_the_key_cannot_end_a_users_stream(keyed):
    async def main() -> tuple[list[str], list[int]]:
        async with httpx.AsyncClient(timeout=60) as client:
            started = asyncio.Event()

            async def user() -> list[str]:
                body = {**CHAT, "max_tokens": 64, "temperature": 0, "stream": True}
                async with client.stream(
                    "POST", f"{keyed['router']}/v1/chat/completions", json=body, headers=GOOD
                ) as r:
                    lines = []
                    async for line in r.aiter_lines():
                        if line.startswith("data:"):
                            lines.append(line[5:].strip())
                            started.set()
                    return lines

            async def intruder() -> list[int]:
                await started.wait()
                return [
                    (await client.post(keyed[port] + "/abort_request", json={"abort_all": True})).status_code
                    for port in ("decode", "prefill", "router")
                ]

            lines, codes = await asyncio.gather(user(), intruder())
            return lines, codes

    lines, codes = asyncio.run(main())
    assert codes == [401, 401, 401]
    assert lines[-1] == "[DONE]"
