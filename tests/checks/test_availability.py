"""Availability checks on literal failed turns: exactly one code per ERROR / TIMEOUT turn."""

from __future__ import annotations

import pytest

from dsv4bench.checks.availability import (
    check_connection_error,
    check_http_error,
    check_timeout_total,
    check_timeout_ttft,
)
from dsv4bench.history.records import TurnStatus

from .turns import failed, turn

CHECKS = {
    "http_error": check_http_error,
    "connection_error": check_connection_error,
    "timeout_ttft": check_timeout_ttft,
    "timeout_total": check_timeout_total,
}

FAILED = [
    (failed(TurnStatus.ERROR, "http_error", 503, "Service Unavailable"), "http_error", "HTTP 503: Service Unavailable"),
    (failed(TurnStatus.ERROR, "http_error", 500, '{"error": "CUDA error"}'), "http_error", "HTTP 500"),
    (failed(TurnStatus.ERROR, None, 429), "http_error", "HTTP 429"),
    (failed(TurnStatus.ERROR, None, 307), "http_error", "HTTP 307"),  # a redirect: no answer came
    (failed(TurnStatus.ERROR, "http_error", None, "bad status"), "http_error", "HTTP None: bad status"),
    (failed(TurnStatus.ERROR, None, 200, "peer closed"), "connection_error", "after HTTP 200: peer closed"),
    (
        failed(TurnStatus.ERROR, "connection_error", None, "ConnectError: refused"),
        "connection_error",
        "connection_error: ConnectError",
    ),
    (
        failed(TurnStatus.ERROR, "connection_error", None, "RemoteProtocolError: peer closed"),
        "connection_error",
        "peer closed",
    ),
    (  # the stream began with 200, then the connection dropped: not an HTTP error
        failed(TurnStatus.ERROR, "connection_error", 200, "RemoteProtocolError: incomplete chunked read"),
        "connection_error",
        "connection_error after HTTP 200: RemoteProtocolError",
    ),
    (failed(TurnStatus.ERROR, None, None, "ReadError"), "connection_error", "unlabelled error: ReadError"),
    (failed(TurnStatus.TIMEOUT, "timeout_ttft", None, "no token after 60 s"), "timeout_ttft", "no first token in time"),
    (failed(TurnStatus.TIMEOUT, "timeout_ttft"), "timeout_ttft", "no first token"),
    (failed(TurnStatus.TIMEOUT, "timeout_ttft", None, "TTFT 120 s"), "timeout_ttft", "TTFT 120 s"),
    (failed(TurnStatus.TIMEOUT, "timeout_total", None, "600 s"), "timeout_total", "did not finish in time: 600 s"),
    (failed(TurnStatus.TIMEOUT, "timeout_total"), "timeout_total", "did not finish"),
    (failed(TurnStatus.TIMEOUT, None), "timeout_total", "(error_kind None)"),
]


@pytest.mark.parametrize(("ctx", "code", "says"), FAILED)
def test_exactly_one_availability_code_fires(ctx, code: str, says: str) -> None:
    fired = {name: check(ctx) for name, check in CHECKS.items() if check(ctx)}
    assert list(fired) == [code]
    [v] = fired[code]
    assert v.code == code and says in v.detail


@pytest.mark.parametrize(
    "ctx",
    [
        turn("fine"),
        turn("", finish=None),
        failed(TurnStatus.KILLED, "connection_error", None, "cancelled by nemesis"),
        failed(TurnStatus.KILLED, "timeout_total"),
        failed(TurnStatus.OK, "http_error", 200),
    ],
)
def test_completed_and_killed_turns_have_no_availability_verdicts(ctx) -> None:
    assert all(check(ctx) == [] for check in CHECKS.values())


def test_long_error_text_is_clipped() -> None:
    [v] = check_http_error(failed(TurnStatus.ERROR, "http_error", 502, "x" * 5000))
    assert len(v.detail) < 250
