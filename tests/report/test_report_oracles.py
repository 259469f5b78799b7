"""The report's "Parser oracles" section: each kept turn's family and the reader that read it, the
turns no reader could read and why, and a family the raw oracle was not offered for."""

from __future__ import annotations

import json
from pathlib import Path

from dsv4bench.families import BY_NAME
from dsv4bench.history.run_folder import read_history
from dsv4bench.history.records import AssembledResponse, OracleReadings, SglangReading, TurnRecord
from dsv4bench.report.markdown import render_report
from dsv4bench.report.summary import summarize

RUN = {
    "run": "o",
    "command": "dsv4bench agents --raw",
    "oracles": {"deepseek-recipe": "deepseek-recipe 0.2.0", "sglang": "sglang 0.5.23"},
}


def render(run_dir: Path) -> str:
    history = read_history(run_dir)
    return render_report(history, summarize(history), [])


def detectors(family: str) -> str:
    """SGLang's tool-call and reasoning detectors for `family`, as the registry names them."""
    f = BY_NAME[family]
    return f"`{f.sglang_parsers[0]}` / `{f.reasoning_parser}`"


def section(md: str) -> str:
    return md.split("## Parser oracles\n", 1)[1].split("\n## ", 1)[0]


def _qwen_read(turn: TurnRecord) -> TurnRecord:
    """`turn` kept by SGLang's qwen25 detector: streamed as the server answered, whole with one call more."""
    assert turn.response is not None
    answer = AssembledResponse(content=turn.response.content, tool_calls=turn.response.tool_calls)
    whole = AssembledResponse(content="", stream=False, tool_calls=turn.response.tool_calls * 2)
    turn.oracles = OracleReadings(
        '<tool_call>{"name": "read_file"}</tool_call>',
        None,
        SglangReading("sglang 0.5.23", answer, whole),
        reader="SGLang qwen25",
        family="qwen",
    )
    return turn


def _unread(turn: TurnRecord, family: str | None, why: str) -> TurnRecord:
    turn.oracles = OracleReadings("raw", None, SglangReading("not read"), None, family, why)
    return turn


def test_a_turn_of_another_family_names_its_family_and_sglangs_detector(run_folder, make_turn) -> None:
    out = section(render(run_folder([_qwen_read(make_turn("s1", 1))], run=RUN)))
    assert f"| qwen | SGLang qwen25 | {detectors('qwen')} | 1 | 0 |" in out
    assert "- session `s1`, turn 1 (coding; qwen read by SGLang qwen25):" in out
    assert "| SGLang streamed, SGLang whole | 1 |" in out and "| server, SGLang as the server answered | 0 |" in out
    assert "deepseekv4" not in out and "DeepSeek-V4 parser" not in out  # no DeepSeek parser named for a Qwen turn


def test_turns_no_reader_could_read_are_listed_and_counted_with_why(run_folder, make_turn) -> None:
    turns = [
        make_turn("s1", 0),
        _unread(make_turn("s1", 1), "kimi-k2", "kimi-k2 is read by SGLang's detectors: SGLang's parser not installed"),
        _unread(make_turn("s2", 0), None, "the raw completion is not text (int)"),
    ]
    md = render(run_folder(turns, run=RUN))
    out = section(md)
    assert f"| kimi-k2 | not read | {detectors('kimi-k2')} | 0 | 1 |" in out
    assert "| family not recorded | not read | – | 0 | 1 |" in out
    assert "Not read: 2 turns no reader could read" in out and "never a disagreement" in out
    assert (
        "- session `s1`, turn 1 (kimi-k2 not read): kimi-k2 is read by SGLang's detectors: SGLang's parser not "
        "installed"
    ) in out
    assert "- session `s2`, turn 0 (family not recorded not read): the raw completion is not text (int)" in out
    assert "readings apart" not in out  # nothing was read, so nothing was read apart
    assert md.splitlines()[2].startswith("**CLEAN**")  # a turn the oracle could not read is no verdict


def test_an_old_history_still_reads_as_deepseek_recipes(run_folder, make_turn) -> None:
    # turns.jsonl of an earlier version: its oracles hold `recipe` and `sglang` only.
    turn = make_turn("s1", 1, content="Use the")
    record = turn.to_json()
    record["oracles"] = {
        "raw_completion": "</think>Use the <｜DSML｜ marker.",
        "recipe": {
            "model": "DeepSeek-V4-Pro",
            "content": "Use the",
            "stream": False,
            "tool_calls": [{"index": 0, "id": "c", "name": "read_file", "arguments": '{"path": "a.py"}'}],
        },
        "sglang": {
            "state": "sglang 0.5.23",
            "stream": None,
            "whole": {"content": "Use the <｜DSML｜ marker.", "stream": False},
        },
    }
    run_dir = run_folder([], run=RUN)
    (run_dir / "turns.jsonl").write_text(json.dumps(record, ensure_ascii=False) + "\n")
    history = read_history(run_dir)
    [kept] = history.turns
    assert kept.oracles is not None and kept.oracles.reader == "deepseek-recipe" and kept.oracles.family is None
    out = section(render(run_dir))
    assert "| family not recorded | deepseek-recipe | – | 1 | 0 |" in out
    assert "- session `s1`, turn 1 (coding; family not recorded read by deepseek-recipe):" in out


def test_a_family_the_raw_oracle_was_not_offered_for_is_said(run_folder, make_turn, event) -> None:
    said = event("raw_not_offered", 1.0, family="qwen", server="http://127.0.0.1:1/v1", reason="no /tokenize")
    md = render(run_folder([make_turn()], run=RUN, events=[said]))
    out = section(md)
    assert (
        "- raw oracle not offered for family `qwen` on this server (no /tokenize): its turns were judged without it."
    ) in out
    assert out.rstrip().endswith("No turn's readings disagreed.")
    assert "raw_not_offered 1" in md  # the run's events row counts it too
    # Said even where run.json has no oracle versions (a history cut short before it was rewritten).
    assert "raw oracle not offered for family `qwen`" in render(run_folder([make_turn()], events=[said]))


def test_hostile_oracle_fields_stay_inside_their_cells(run_folder, make_turn) -> None:
    turn = _unread(make_turn("s1", 1), "x|<script>", "why | <b>")
    turn.oracles.reader = "a|b"  # type: ignore[union-attr]  # _unread gave it its readings
    out = section(render(run_folder([turn], run=RUN)))
    assert "<script>" not in out and "<b>" not in out
    assert "| x\\|&lt;script&gt; | not read | – | 0 | 1 |" in out
