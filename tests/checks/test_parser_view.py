"""The parsers' view of a --raw turn: the server's answer beside deepseek-recipe's and SGLang's
readings, field by field, and which of them a run keeps."""

from __future__ import annotations

import pytest

from dsv4bench.checks import sglang_oracle
from dsv4bench.checks.parser_view import (NOT_READ, RECIPE, SERVER, SGLANG_STREAM, SGLANG_WHOLE, disagreements,
                                          first_reader, kept_oracles, not_read, read_oracles, readings, sglang_like)
from dsv4bench.checks.sglang_oracle import sglang_missing
from dsv4bench.records import OracleReadings, ToolCall

from .turns import BLOCK, turn

installed = pytest.mark.skipif(sglang_missing() is not None, reason=sglang_missing() or "")
READ_MAIN = ToolCall(0, "call_0", "read_file", '{"path": "src/main.py"}')


@installed
def test_a_server_that_answers_as_every_parser_reads_is_not_kept() -> None:
    ctx = turn(calls=[ToolCall(0, "c", "read_file", '{ "path" : "src/main.py" }')], raw="</think>" + BLOCK)
    oracles = read_oracles(ctx)
    assert oracles is not None and ctx.response is not None
    assert list(readings(ctx.response, oracles)) == [SERVER, RECIPE, SGLANG_STREAM, SGLANG_WHOLE]
    assert disagreements(ctx.response, oracles) == [] and kept_oracles(ctx) is None


@installed
def test_the_view_groups_the_sources_that_agree() -> None:
    # A stray marker: deepseek-recipe and SGLang streamed cut the prose there, SGLang whole keeps it.
    raw = "</think>Use the <｜DSML｜ marker wisely. Done."
    ctx = turn("Use the", raw=raw)
    kept = kept_oracles(ctx)
    assert kept is not None and ctx.response is not None
    [d] = disagreements(ctx.response, kept)
    assert d.where == "content"
    assert [sources for sources, _ in d.groups] == [(SERVER, RECIPE, SGLANG_STREAM), (SGLANG_WHOLE,)]
    assert d.apart(RECIPE, SGLANG_WHOLE) and not d.apart(SERVER, sglang_like(ctx.response))
    assert d.describe() == ("content: server = deepseek-recipe = SGLang streamed 'Use the'; "
                            "SGLang whole 'Use the <｜DSML｜ marker wisely. Done.'")


@installed
def test_calls_one_reading_lacks_show_as_no_call() -> None:
    raw = "</think>" + BLOCK + "\n\n" + BLOCK.replace("src/main.py", "b.py")  # SGLang reads both blocks
    ctx = turn(calls=[READ_MAIN], raw=raw)
    kept = kept_oracles(ctx)
    assert kept is not None and ctx.response is not None
    names, args = disagreements(ctx.response, kept)
    assert names.describe() == ('tool call names: server = deepseek-recipe \'["read_file"]\'; '
                                'SGLang streamed = SGLang whole \'["read_file", "read_file"]\'')
    assert args.describe() == ("tool_calls[1].arguments: server = deepseek-recipe -; "
                               "SGLang streamed = SGLang whole '{\"path\": \"b.py\"}'")


def test_without_sglang_the_view_is_the_server_and_deepseek_recipe(monkeypatch) -> None:
    monkeypatch.setattr(sglang_oracle, "_sglang", lambda: "SGLang's parser not installed (No module named 'sglang')")
    ctx = turn("I'll read it.", raw="</think>I'll read it.\n\n" + BLOCK)
    kept = kept_oracles(ctx)
    assert kept is not None and ctx.response is not None
    assert kept.sglang.state.startswith("SGLang's parser not installed")
    assert list(readings(ctx.response, kept)) == [SERVER, RECIPE]
    assert [d.where for d in disagreements(ctx.response, kept)] == ["tool call names", "tool_calls[0].arguments"]


def test_no_raw_completion_is_no_view_and_one_no_reader_can_read_is_kept_as_not_read() -> None:
    assert read_oracles(turn("Hi.")) is None
    unreadable = turn("Hi.", raw=None)
    unreadable.raw_completion = 5  # type: ignore[assignment]  # what a hostile capture may hold
    kept = kept_oracles(unreadable)
    assert kept is not None and unreadable.response is not None
    assert not_read(kept) == "the raw completion is not text (int)" and first_reader(kept) == NOT_READ
    assert list(readings(unreadable.response, kept)) == [SERVER] and disagreements(unreadable.response, kept) == []
    assert OracleReadings.from_json(kept.to_json()) == kept  # a history keeps why


@installed
def test_readings_survive_the_history() -> None:
    ctx = turn("Use the", raw="</think>Use the <｜DSML｜ marker wisely. Done.")
    kept = kept_oracles(ctx)
    assert kept is not None
    assert OracleReadings.from_json(kept.to_json()) == kept
