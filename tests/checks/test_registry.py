"""The registry and `run_checks`: status rules, unknown outcomes, clean turns stay clean."""

from __future__ import annotations

import pytest

from dsv4bench.checks import CHECKERS, checkers_for, run_checks
from dsv4bench.history.codes import AVAILABILITY_CODES, CORRUPTION_CODES, ORACLE_CODE
from dsv4bench.history.records import TurnStatus, Verdict

from .test_text import JSON_ARRAY, MARKDOWN_TABLE, PYTHON_FILE
from .turns import BLOCK, failed, turn

CLEAN_TURNS = {
    "prose": turn("The tests pass now.", reasoning="Check the output, then answer."),
    "one call": turn("Reading it.", calls=[("read_file", {"path": "src/main.py"})]),
    "two calls": turn(calls=[("list_services", {}), ("set_log_level", {"service": "api", "level": "info"})]),
    "file write": turn(calls=[("edit_file", {"path": "cfg.py", "edits": [{"old": "", "new": PYTHON_FILE}]})]),
    "table": turn(MARKDOWN_TABLE),
    "json": turn("```json\n" + JSON_ARRAY + "\n```"),
    "chinese": turn("配置｜测试｜部署：全部完成。", reasoning="用户需要一个总结。"),
}


def test_registry_covers_every_corruption_and_availability_code() -> None:
    # and the evidence judged on every ok turn; the oracle's own code runs only with --raw
    assert set(CHECKERS) == set(CORRUPTION_CODES) | set(AVAILABILITY_CODES) | {"markup_unproven"}
    assert all(fn.__name__ == f"check_{code}" for code, fn in CHECKERS.items())


@pytest.mark.parametrize("ctx", CLEAN_TURNS.values(), ids=CLEAN_TURNS.keys())
def test_clean_turns_get_no_verdicts_from_any_checker(ctx) -> None:
    assert run_checks(ctx) == ([], [])


def test_a_corrupt_turn_collects_verdicts_from_several_checkers() -> None:
    ctx = turn("Sure.\n\n" + BLOCK, finish="tool_calls", protocol_errors=["stream ended without [DONE]"])
    verdicts, errors = run_checks(ctx)
    assert errors == []
    assert {v.code for v in verdicts} == {"dsml_leak_content", "finish_reason_mismatch", "stream_protocol"}


@pytest.mark.parametrize(
    "ctx",
    [
        turn("Sure.\n\n" + BLOCK, status=TurnStatus.KILLED),
        turn("", finish=None, status=TurnStatus.KILLED),
        turn(calls=[("nope", "not json")], status=TurnStatus.KILLED, raw="x</think>y"),
        failed(TurnStatus.KILLED, "connection_error", None, "cancelled"),
    ],
)
def test_killed_turns_get_no_verdicts_at_all(ctx) -> None:
    assert checkers_for(ctx) == {}
    assert run_checks(ctx) == ([], [])


@pytest.mark.parametrize(
    ("ctx", "code"),
    [
        (failed(TurnStatus.ERROR, "http_error", 503, "overloaded"), "http_error"),
        (failed(TurnStatus.ERROR, "connection_error", None, "reset"), "connection_error"),
        (failed(TurnStatus.TIMEOUT, "timeout_ttft"), "timeout_ttft"),
        (failed(TurnStatus.TIMEOUT, "timeout_total"), "timeout_total"),
    ],
)
def test_failed_turns_get_only_availability_verdicts(ctx, code: str) -> None:
    assert set(checkers_for(ctx)) == set(AVAILABILITY_CODES)
    verdicts, errors = run_checks(ctx)
    assert [v.code for v in verdicts] == [code] and errors == []


def test_failed_turn_with_a_partial_response_is_not_judged_for_corruption() -> None:
    ctx = turn("Sure.\n\n" + BLOCK, finish=None, status=TurnStatus.TIMEOUT)
    ctx.error_kind = "timeout_total"
    verdicts, _ = run_checks(ctx)
    assert [v.code for v in verdicts] == ["timeout_total"]


def _boom(ctx) -> list[Verdict]:
    raise RuntimeError("checker bug")


def test_a_raising_checker_becomes_a_check_error_not_a_crash() -> None:
    ctx = turn("", finish="length")
    verdicts, errors = run_checks(ctx, {**CHECKERS, "empty_turn": _boom, "garbled_text": _boom})
    assert errors == ["empty_turn: RuntimeError: checker bug", "garbled_text: RuntimeError: checker bug"]
    assert [v.code for v in verdicts] == ["truncated"]  # the others still ran


def test_an_ok_turn_without_a_response_is_unknown() -> None:
    ctx = turn("x")
    ctx.response = None
    verdicts, errors = run_checks(ctx)
    assert verdicts == [] and len(errors) == 1 and "no response" in errors[0]


def test_oracle_runs_only_with_a_raw_completion() -> None:
    assert ORACLE_CODE not in checkers_for(turn("Hi."))
    assert ORACLE_CODE in checkers_for(turn("Hi.", raw="Hi."))
    assert ORACLE_CODE not in checkers_for(failed(TurnStatus.ERROR, "http_error", 500))


def test_oracle_disagreement_is_reported_beside_the_corruption_verdicts() -> None:
    raw = "Reading.\n\n" + BLOCK.replace("src/main.py", "a.py")
    ctx = turn("Reading.\n\n" + BLOCK.replace("src/main.py", "a.py"), finish="stop", raw=raw)
    verdicts, errors = run_checks(ctx)
    assert errors == []
    codes = [v.code for v in verdicts]
    assert "dsml_leak_content" in codes and ORACLE_CODE in codes
