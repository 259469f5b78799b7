"""The parsers' view of a --raw turn: the server's answer beside deepseek-recipe's and SGLang's
readings, field by field, which of them a run keeps, and the record of them: the family read as,
its reader, why nothing read it; records written before these were kept still read."""

from __future__ import annotations

import pytest

from dsv4bench.checks import sglang_oracle
from dsv4bench.checks.parser_view import (
    NOT_READ,
    RECIPE,
    SERVER,
    SGLANG_STREAM,
    SGLANG_WHOLE,
    disagreements,
    family_read_as,
    first_reader,
    kept_oracles,
    not_read,
    read_oracles,
    readings,
    sglang_like,
)
from dsv4bench.checks.sglang_oracle import sglang_missing
from dsv4bench.history.records import OracleReadings, ToolCall

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
    assert d.describe() == (
        "content: server = deepseek-recipe = SGLang streamed 'Use the'; "
        "SGLang whole 'Use the <｜DSML｜ marker wisely. Done.'"
    )


@installed
def test_calls_one_reading_lacks_show_as_no_call() -> None:
    raw = "</think>" + BLOCK + "\n\n" + BLOCK.replace("src/main.py", "b.py")  # SGLang reads both blocks
    ctx = turn(calls=[READ_MAIN], raw=raw)
    kept = kept_oracles(ctx)
    assert kept is not None and ctx.response is not None
    names, args = disagreements(ctx.response, kept)
    assert names.describe() == (
        "tool call names: server = deepseek-recipe '[\"read_file\"]'; "
        'SGLang streamed = SGLang whole \'["read_file", "read_file"]\''
    )
    assert args.describe() == (
        'tool_calls[1].arguments: server = deepseek-recipe -; SGLang streamed = SGLang whole \'{"path": "b.py"}\''
    )


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
    assert kept.reader is None and kept.recipe is None
    assert list(readings(unreadable.response, kept)) == [SERVER] and disagreements(unreadable.response, kept) == []
    assert OracleReadings.from_json(kept.to_json()) == kept  # a history keeps why


@installed
def test_readings_survive_the_history() -> None:
    ctx = turn("Use the", raw="</think>Use the <｜DSML｜ marker wisely. Done.")
    kept = kept_oracles(ctx)
    assert kept is not None
    assert OracleReadings.from_json(kept.to_json()) == kept


def test_a_deepseek_v4_reading_says_its_family_and_reader() -> None:
    ctx = turn("I'll read it.", raw="</think>I'll read it.\n\n" + BLOCK)
    kept = kept_oracles(ctx)  # the server sent no call where the text holds one
    assert kept is not None
    assert (kept.family, kept.reader, kept.not_read) == ("deepseek-v4", RECIPE, None)
    assert kept.recipe is not None and [c.name for c in kept.recipe.tool_calls] == ["read_file"]
    saved = kept.to_json()
    assert (saved["family"], saved["reader"], saved["not_read"]) == ("deepseek-v4", RECIPE, None)
    assert OracleReadings.from_json(saved) == kept


@installed
def test_another_familys_reading_names_sglangs_detector_and_keeps_no_recipe_reading() -> None:
    raw = 'Done.\n<tool_call>\n{"name": "read_file", "arguments": {"path": "src/main.py"}}\n</tool_call><|im_end|>'
    ctx = turn("Done.", raw=raw, family="qwen")  # the server dropped the call
    kept = kept_oracles(ctx)
    assert kept is not None and ctx.response is not None
    assert (kept.family, kept.reader, kept.recipe) == ("qwen", "SGLang qwen25", None)
    assert first_reader(kept) == "SGLang qwen25" and RECIPE not in readings(ctx.response, kept)
    assert OracleReadings.from_json(kept.to_json()) == kept


def test_a_text_of_a_family_only_sglang_reads_is_not_read_without_sglang(monkeypatch) -> None:
    monkeypatch.setattr(sglang_oracle, "_sglang", lambda: "SGLang's parser not installed (No module named 'sglang')")
    raw = 'Done.\n<tool_call>\n{"name": "read_file", "arguments": {}}\n</tool_call>'
    kept = kept_oracles(turn("Done.", raw=raw, family="qwen"))
    assert kept is not None and (kept.family, kept.reader) == ("qwen", None)
    assert kept.not_read is not None and "SGLang's parser not installed" in kept.not_read
    assert first_reader(kept) == NOT_READ
    assert OracleReadings.from_json(kept.to_json()) == kept


OLD_ANSWER = {"model": "DeepSeek-V4-Pro", "content": "Use the", "stream": False, "finish_reason": "stop"}


def test_a_record_from_before_the_readers_were_named_was_deepseek_recipes() -> None:
    # What turns.jsonl held before other families were read: `recipe` and `sglang` only.
    old = OracleReadings.from_json(
        {
            "raw_completion": "</think>Use the <｜DSML｜ marker.",
            "recipe": OLD_ANSWER,
            "sglang": {"state": "sglang 0.5.23", "stream": None, "whole": None, "log": []},
        }
    )
    assert (old.reader, old.family, old.not_read) == (RECIPE, None, None)
    assert old.recipe is not None and old.recipe.content == "Use the" and old.sglang.state == "sglang 0.5.23"
    assert first_reader(old) == RECIPE and family_read_as(old) == "family not recorded"
    assert OracleReadings.from_json(old.to_json()) == old  # written again, it reads the same


def test_records_of_the_stopgap_that_named_the_reader_in_the_model_read_as_meant() -> None:
    sglang_first = OracleReadings.from_json(
        {
            "raw_completion": "x",
            "recipe": {**OLD_ANSWER, "model": "SGLang qwen25"},
            "sglang": {"state": "sglang 0.5.23"},
        }
    )
    assert (sglang_first.reader, sglang_first.recipe, sglang_first.not_read) == ("SGLang qwen25", None, None)
    unread = OracleReadings.from_json(
        {
            "raw_completion": "x",
            "recipe": {"model": "not read", "stream": False},
            "sglang": {"state": "not read: no reader for model family 'x'"},
        }
    )
    assert (unread.reader, unread.recipe, unread.not_read) == (None, None, "no reader for model family 'x'")
    assert not_read(unread) == "no reader for model family 'x'" and first_reader(unread) == NOT_READ


def test_a_damaged_oracle_record_is_not_passed_off_as_read() -> None:
    empty = OracleReadings.from_json({"raw_completion": "x"})
    assert empty.reader is None and empty.not_read == "the record kept no reading"
    odd = OracleReadings.from_json(
        {"raw_completion": "x", "reader": 5, "family": ["qwen"], "not_read": None, "recipe": None, "sglang": {}}
    )
    assert (odd.reader, odd.family, odd.not_read) == (None, None, "the record names no reader")
    assert first_reader(odd) == NOT_READ
    with pytest.raises(ValueError):  # a reading of the wrong shape makes the record unreadable, as any field does
        OracleReadings.from_json({"raw_completion": "x", "reader": RECIPE, "recipe": "text"})
