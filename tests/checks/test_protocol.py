"""Turn-shape checks on literal turns: finish_reason, empty, truncated, stream protocol."""

from __future__ import annotations

import dataclasses

import pytest

from dsv4bench.checks import run_checks
from dsv4bench.checks.protocol import (
    check_empty_turn,
    check_finish_reason_mismatch,
    check_stream_protocol,
    check_truncated,
)
from dsv4bench.history.records import ToolCall, TurnContext
from dsv4bench.history.request_terms import RequestTerms
from dsv4bench.wire.turn_answer import TurnOutcome
from dsv4bench.harness.turn_judge import request_context

from .turns import turn


def asked(ctx: TurnContext, **body: object) -> TurnContext:
    """`ctx` as the answer to a request whose body held `body`'s fields."""
    terms = RequestTerms.of_body({"messages": [], **body})
    return dataclasses.replace(ctx, terms=terms, thinking=terms.thinking)


READ = ("read_file", {"path": "a.py"})

CLEAN = {
    "prose, stop": turn("The answer is 42."),
    "one call, tool_calls": turn(calls=[READ]),
    "prose and two calls": turn("Reading both.", calls=[READ, ("read_file", {"path": "b.py"})]),
    "reasoning then prose": turn("Done.", reasoning="The user wants a summary."),
    "content_filter": turn("I can't help with that.", finish="content_filter"),
    "non-stream body": turn("Hi.", stream=False, saw_done=False),
}


@pytest.mark.parametrize("ctx", CLEAN.values(), ids=CLEAN.keys())
def test_clean_turns_pass_every_shape_check(ctx) -> None:
    for check in (check_finish_reason_mismatch, check_empty_turn, check_stream_protocol, check_truncated):
        assert check(ctx) == [], check.__name__


@pytest.mark.parametrize(
    ("ctx", "says"),
    [
        (turn("Let me read it.", finish="tool_calls"), "'tool_calls' but no tool calls"),
        (turn("", finish="tool_calls"), "'tool_calls' but no tool calls"),
        (turn("<｜DSML｜tool_calls>", finish="tool_calls"), "'tool_calls' but no tool calls"),  # calls leaked to text
        (turn(calls=[READ], finish="stop"), "'stop' with 1 tool call(s): read_file"),
        (turn("ok", calls=[READ, READ], finish="stop"), "'stop' with 2 tool call(s)"),
        (turn("partial", finish="abort"), "unexpected finish_reason 'abort'"),
    ],
)
def test_finish_reason_mismatch(ctx, says: str) -> None:
    [v] = check_finish_reason_mismatch(ctx)
    assert v.code == "finish_reason_mismatch" and v.where == "finish_reason"
    assert says in v.detail


@pytest.mark.parametrize("finish", ["length", None])
def test_cut_turns_are_not_finish_reason_mismatches(finish: str | None) -> None:
    assert check_finish_reason_mismatch(turn(calls=[READ], finish=finish)) == []
    assert check_finish_reason_mismatch(turn("", finish=finish)) == []


@pytest.mark.parametrize(
    "ctx",
    [
        turn(""),
        turn("  \n\t "),
        turn("", reasoning=" \n"),
        turn("", finish="tool_calls"),
        # the calls a "tool_calls" announces were dropped: no stop sequence explains that
        asked(turn("", finish="tool_calls"), stop=["\nObservation:"]),
    ],
)
def test_empty_turn(ctx) -> None:
    [v] = check_empty_turn(ctx)
    assert v.code == "empty_turn" and v.where == "content"
    assert "no content, no reasoning and no tool calls" in v.detail


@pytest.mark.parametrize(
    "ctx",
    [
        turn("", finish="length"),
        turn("", finish=None),
        turn("", calls=[READ]),
        turn("."),
        # reasoning only is not "nothing": reasoning_only judges it (checks/request_compliance.py)
        turn("", reasoning="I need to read the file, then answer."),
        turn("\n\n", reasoning="Thinking..."),
        # the request's own stop sequence may match at the answer's first character
        asked(turn(""), stop=["\n"]),
        # a prefilled assistant message the model may find complete as it is
        asked(turn(""), messages=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]),
    ],
)
def test_not_empty(ctx) -> None:
    assert check_empty_turn(ctx) == []


def test_a_turn_that_only_thought_is_reasoning_only_alone() -> None:
    verdicts, errors = run_checks(turn("", reasoning="I need to read the file first."))
    assert errors == [] and [v.code for v in verdicts] == ["reasoning_only"]


# --- a turn cut at its token cap whose finish_reason says otherwise ------------------------


def capped(ctx: TurnContext, completion_tokens: object, max_tokens: object, **body: object) -> TurnContext:
    """`ctx` with usage.completion_tokens and the request's max_tokens (and other body fields)."""
    assert ctx.response is not None
    ctx.response.usage = {"prompt_tokens": 900, "completion_tokens": completion_tokens}
    return dataclasses.replace(asked(ctx, **body) if body else ctx, max_tokens=max_tokens)


CUT_CALL = ("edit_file", {"path": "a.py", "edits": [{"old": "x", "new": "y"}]})  # parses: only the count tells

CUT_AT_CAP = {
    "call, says tool_calls": (
        capped(turn(calls=[CUT_CALL]), 256, 256),
        "completion_tokens 256 reached max_tokens 256 but finish_reason 'tool_calls'",
    ),
    "call, says stop": (
        capped(turn(calls=[CUT_CALL], finish="stop"), 256, 256),
        "reached max_tokens 256 but finish_reason 'stop'",
    ),
    "prose, says stop": (capped(turn("The answer is"), 64, 64), "reached max_tokens 64 but finish_reason 'stop'"),
    "past the cap": (capped(turn(calls=[READ]), 300, 256), "completion_tokens 300 reached max_tokens 256 (past it)"),
    "streamed or not": (capped(turn(calls=[READ], stream=False), 128, 128), "but finish_reason 'tool_calls'"),
    "past the cap under stop sequences": (
        capped(turn("Thought:"), 65, 64, stop=["\nObservation:"]),
        "(past it) but finish_reason 'stop'",
    ),
    "stop sequences, but tool_calls": (
        capped(turn(calls=[READ]), 64, 64, stop=["\nObservation:"]),
        "but finish_reason 'tool_calls'",
    ),
    "reasoning cut, says stop": (
        capped(turn("", reasoning="First, consider"), 512, 512),
        "reached max_tokens 512 but finish_reason 'stop'",
    ),
}


@pytest.mark.parametrize(("ctx", "says"), CUT_AT_CAP.values(), ids=CUT_AT_CAP.keys())
def test_a_turn_cut_at_the_cap_that_says_otherwise_is_one_finish_reason_mismatch(ctx, says: str) -> None:
    verdicts, errors = run_checks(ctx)
    assert errors == []
    # one owner per fault: the lie, never also truncated, reasoning_only or empty_turn
    [v] = [v for v in verdicts if v.code in ("finish_reason_mismatch", "truncated", "reasoning_only", "empty_turn")]
    assert v.code == "finish_reason_mismatch" and v.where == "finish_reason" and says in v.detail, verdicts


def test_the_cap_is_read_from_max_completion_tokens_too() -> None:
    body = {"messages": [], "stream": True, "max_completion_tokens": 100}
    outcome = TurnOutcome.starting()
    outcome.response = turn(calls=[READ]).response
    ctx = request_context(body, outcome)
    ctx.response.usage = {"completion_tokens": 100}
    [v] = check_finish_reason_mismatch(ctx)
    assert "completion_tokens 100 reached max_tokens 100" in v.detail


NOT_CUT = {
    "one below the cap, tool_calls": capped(turn(calls=[READ]), 255, 256),
    "one below the cap, stop": capped(turn("Done."), 255, 256),
    "length at the cap": capped(turn("The answer is", finish="length"), 256, 256),
    "no max_tokens": capped(turn(calls=[READ]), 4096, None),
    "usage absent": dataclasses.replace(turn(calls=[READ]), max_tokens=256),
    "usage null": capped(turn(calls=[READ]), None, 256),
    "usage not a number": capped(turn(calls=[READ]), "256", 256),
    "max_tokens not an integer": capped(turn(calls=[READ]), 256, "256"),
    "max_tokens a bool": capped(turn(calls=[READ]), 1, True),
    "max_tokens a float": capped(turn(calls=[READ]), 256, 256.0),
    # vLLM reports a stop string matched in the cap's last token as "stop"
    "stop exactly at the cap under stop sequences": capped(turn("Thought: read it."), 64, 64, stop=["\nObservation:"]),
    "cut with no finish_reason is truncated's": capped(turn("The answer", finish=None), 64, 64),
}


@pytest.mark.parametrize("ctx", NOT_CUT.values(), ids=NOT_CUT.keys())
def test_turns_not_cut_at_the_cap_are_no_cap_finding(ctx) -> None:
    assert check_finish_reason_mismatch(ctx) == []


def test_length_at_the_cap_stays_truncated() -> None:
    ctx = capped(turn("The answer is", finish="length"), 256, 256)
    assert check_finish_reason_mismatch(ctx) == []
    [v] = check_truncated(ctx)
    assert "max_tokens=256, completion_tokens=256" in v.detail


@pytest.mark.parametrize(
    ("ctx", "says"),
    [
        (turn("The answer is", finish="length"), "finish_reason 'length'"),
        (turn(calls=[("read_file", '{"pa')], finish="length"), "finish_reason 'length'"),
        (turn("The answer is", finish=None, saw_done=False), "stream ended without a finish_reason, saw [DONE]=False"),
        (turn("The answer is", finish=None, saw_done=True), "saw [DONE]=True"),
        (turn("Hi", finish=None, stream=False), "response body ended without a finish_reason"),
    ],
)
def test_truncated(ctx, says: str) -> None:
    [v] = check_truncated(ctx)
    assert v.code == "truncated" and says in v.detail


def test_truncated_reports_the_limits() -> None:
    ctx = turn("The answer is", finish="length", usage={"completion_tokens": 256})
    ctx.max_tokens = 256
    [v] = check_truncated(ctx)
    assert "max_tokens=256, completion_tokens=256" in v.detail


@pytest.mark.parametrize(
    "errors",
    [
        ["tool call index 2 after 0: index gap"],
        ["tool call 0: first delta has no id", "tool call 0: first delta has no name"],
        ["delta after finish_reason"],
        ["stream ended without [DONE]"],
        ["undecodable chunk: 'data: {\"id\": '"],
    ],
)
def test_stream_protocol_maps_each_assembler_error(errors: list[str]) -> None:
    verdicts = check_stream_protocol(turn("ok", protocol_errors=errors))
    assert [v.detail for v in verdicts] == errors
    assert all(v.code == "stream_protocol" for v in verdicts)


def test_duplicate_tool_call_ids() -> None:
    calls = [
        ToolCall(0, "call_a", "read_file", '{"path": "a"}'),
        ToolCall(1, "call_b", "read_file", '{"path": "b"}'),
        ToolCall(2, "call_a", "read_file", '{"path": "c"}'),
    ]
    [v] = check_stream_protocol(turn(calls=calls))
    assert "'call_a' used by 2 calls" in v.detail and v.where == "tool_calls[0],tool_calls[2]"


def test_missing_ids_are_not_duplicates() -> None:
    calls = [ToolCall(0, None, "read_file", "{}"), ToolCall(1, None, "read_file", "{}")]
    assert check_stream_protocol(turn(calls=calls)) == []


def test_a_response_stopped_at_a_bound_is_stream_protocol_not_truncated() -> None:
    ctx = turn("x" * 10, finish=None, saw_done=False)
    ctx.response.stopped_at_bound = "an SSE line longer than 1,048,576 characters"
    ctx.response.protocol_errors = ["the harness stopped reading: an SSE line longer than 1,048,576 characters"]
    assert check_truncated(ctx) == [] and check_empty_turn(ctx) == []
    [v] = check_stream_protocol(ctx)
    assert "1,048,576" in v.detail
