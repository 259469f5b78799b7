"""Turn-shape checks on literal turns: finish_reason, empty, truncated, stream protocol."""

from __future__ import annotations

import pytest

from dsv4bench.checks.protocol import check_empty_turn, check_finish_reason_mismatch, check_stream_protocol, check_truncated
from dsv4bench.records import ToolCall

from .turns import turn

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
        turn("", reasoning="I need to read the file, then answer."),
        turn("\n\n", reasoning="Thinking..."),
        turn("", finish="tool_calls"),
    ],
)
def test_empty_turn(ctx) -> None:
    [v] = check_empty_turn(ctx)
    assert v.code == "empty_turn" and v.where == "content"


def test_empty_turn_says_when_the_model_only_thought() -> None:
    [v] = check_empty_turn(turn("", reasoning="abc"))
    assert "reasoning only (3 chars)" in v.detail


@pytest.mark.parametrize(
    "ctx",
    [turn("", finish="length"), turn("", finish=None), turn("", calls=[READ]), turn(".")],
)
def test_not_empty(ctx) -> None:
    assert check_empty_turn(ctx) == []


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
