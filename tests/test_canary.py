"""Canary and /health results: only a canary that got no answer in time is a hang; an answer
that is no completion (HTTP error, HTML, non-JSON) is an error of the check, never a verdict."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace

import anyio
import httpx
import pytest

from dsv4bench.servers.canary import (
    ERROR,
    FAILING,
    OK,
    TIMEOUT,
    UNREACHABLE,
    CanaryResult,
    HealthResult,
    check_canary,
    check_health,
)
from dsv4bench.history.codes import WEDGE_CODES
from dsv4bench.servers.probe import probe, probe_exit_code
from dsv4bench.servers.wedge import WedgeConfig, detect_wedge
from tests.fixtures.wedge_server import WedgeState, serve_in_thread

COMPLETION = {
    "id": "c1",
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "OK"}, "finish_reason": "stop"}],
}


def _run(handler, fn=check_canary, timeout: float = 1.0):
    async def main():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            if fn is check_canary:
                return await check_canary(client, "http://s/v1", "m", timeout=timeout)
            return await fn(client, "http://s", "/health", timeout=timeout)

    return anyio.run(main)


@pytest.mark.parametrize(
    "response,status,needle",
    [
        (lambda: httpx.Response(200, html="<!DOCTYPE html><html><body>hi</body></html>"), 200, "HTML"),
        (lambda: httpx.Response(200, text="OK"), 200, "not JSON"),
        (lambda: httpx.Response(200, json=[1, 2]), 200, "no choices"),
        (lambda: httpx.Response(200, json={"choices": []}), 200, "no choices"),
        (lambda: httpx.Response(404, text="Not Found"), 404, "HTTP 404: Not Found"),
        (lambda: httpx.Response(401, json={"error": {"message": "Invalid API key"}}), 401, "HTTP 401: Invalid API key"),
        (
            lambda: httpx.Response(500, html="<html><body>Internal Server Error</body></html>"),
            500,
            "HTTP 500: an HTML page",
        ),
    ],
    ids=["html", "text", "json-list", "no-choices", "404", "401", "500-html"],
)
def test_an_answer_that_is_no_completion_is_an_error_not_a_timeout(response, status, needle):
    c = _run(lambda request: response())
    assert c.result == ERROR and not c.ok and c.http_status == status
    assert needle in c.error
    found = detect_wedge([], 0, WedgeConfig(), canaries=[c])
    assert found["http://s/v1"].codes == []
    assert any(needle in e for e in found["http://s/v1"].check_errors)


def test_a_completion_is_ok():
    c = _run(lambda request: httpx.Response(200, json=COMPLETION))
    assert c.ok and c.result == OK and c.error is None and c.http_status == 200
    d = c.as_dict()
    # The fields events.jsonl, run.py and the report read stay.
    assert {"t_ns", "endpoint", "ok", "latency_s", "error", "result"} <= set(d) and d["ok"] is True


def test_no_answer_in_time_is_a_timeout_and_the_only_hang():
    async def slow(request):
        await anyio.sleep(5)
        return httpx.Response(200, json=COMPLETION)

    t0 = time.monotonic()
    c = _run(slow, timeout=0.3)
    assert time.monotonic() - t0 < 2
    assert c.result == TIMEOUT and c.error == "timeout after 0.3 s"
    h = HealthResult(c.t_ns, "http://s/health", OK, 0.0, status=200)
    found = detect_wedge([], 0, WedgeConfig(), health=[h], canaries=[c])
    assert found["http://s/v1"].codes == ["canary_timeout", "health_lies"]


def test_a_refused_connection_is_unreachable_and_a_dropped_one_an_error():
    def refuse(request):
        raise httpx.ConnectError("refused", request=request)

    def drop(request):
        raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)

    assert _run(refuse).result == UNREACHABLE
    assert _run(drop).result == ERROR
    for c in (_run(refuse), _run(drop)):
        h = HealthResult(c.t_ns, "http://s/health", OK, 0.0, status=200)
        codes = detect_wedge([], 0, WedgeConfig(), health=[h], canaries=[c])["http://s/v1"].codes
        assert codes == [], c


def test_health_results():
    assert _run(lambda r: httpx.Response(200), check_health).result == OK
    h = _run(lambda r: httpx.Response(503), check_health)
    assert h.result == FAILING and h.status == 503

    def refuse(request):
        raise httpx.ConnectError("refused", request=request)

    h = _run(refuse, check_health)
    assert h.result == UNREACHABLE and h.status is None and h.error.startswith("ConnectError")


def test_health_generate_hanging_on_a_server_without_a_canary_is_health_lies():
    h = HealthResult(1, "http://p/health", OK, 0.0, status=200)
    gen = HealthResult(1, "http://p/health_generate", TIMEOUT, 0.0, error="timeout after 5 s")
    found = detect_wedge([], 0, WedgeConfig(), health=[h, gen])
    assert found["http://p/health_generate"].codes == ["health_lies"]
    # Honest /health: no lie. A canary of its own: the canary decides, not /health_generate.
    honest = detect_wedge([], 0, WedgeConfig(), health=[replace(h, status=503, result=FAILING), gen])
    assert all(not f.codes for f in honest.values())
    ok = CanaryResult(1, "http://p/v1", OK, 0.1)
    assert all(not f.codes for f in detect_wedge([], 0, WedgeConfig(), health=[h, gen], canaries=[ok]).values())
    assert set(found["http://p/health_generate"].codes) <= set(WEDGE_CODES)


# --- a real server answering 200 with HTML ---------------------------------------------------------


@pytest.fixture
def html_server() -> Iterator[str]:
    with serve_in_thread(WedgeState(chat_answer="html")) as root:
        yield root


def test_a_server_answering_html_is_never_canary_timeout(html_server):
    async def checks():
        async with httpx.AsyncClient(trust_env=False) as client:
            return (
                await check_health(client, html_server, timeout=2),
                await check_canary(client, f"{html_server}/v1", "wedge-test", timeout=2),
            )

    h, c = anyio.run(checks)
    assert h.status == 200 and c.result == ERROR and not c.ok and "HTML" in c.error
    found = detect_wedge([], 0, WedgeConfig(), health=[h], canaries=[c])
    assert all(not f.codes for f in found.values()), found
    result = probe([html_server], timeout=2)
    [ep] = result.endpoints
    assert ep.codes == [] and ep.state == "error" and ep.canary.result == ERROR
    assert probe_exit_code(result) == 2  # not judged: the check did not work, the server is not called wedged
