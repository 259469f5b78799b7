"""The --raw oracle: deepseek-recipe renders and parses; disagreements with the server are verdicts."""

from __future__ import annotations

import json

import pytest

from dsv4bench.checks.oracle import check_parser_disagreement, json_equal
from dsv4bench.checks.recipe_reader import parse_raw_completion, render_prompt
from dsv4bench.history.codes import ORACLE_CODE

from .turns import BLOCK, TOOLS, turn

BODY = {
    "model": "dsv4-mini",
    "messages": [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Read src/main.py"},
    ],
    "tools": [{"type": "function", "function": {"name": n, "parameters": s}} for n, s in TOOLS.items()],
    "tool_choice": "auto",
    "chat_template_kwargs": {"thinking": True},
}
RAW = "The user wants the file.</think>I'll read it.\n\n" + BLOCK + "<｜end▁of▁sentence｜>"
EDIT_RAW = (
    "</think><｜DSML｜tool_calls>\n"
    '<｜DSML｜invoke name="edit_file">\n'
    '<｜DSML｜parameter name="path" string="true">a.py</｜DSML｜parameter>\n'
    '<｜DSML｜parameter name="edits" string="false">[{"old": "x = 1", "new": "x = 2"}]</｜DSML｜parameter>\n'
    "</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>"
)


def test_render_prompt_writes_the_dsv4_prompt() -> None:
    prompt = render_prompt(BODY)
    assert prompt.startswith("<｜begin▁of▁sentence｜>")
    assert "You are a coding agent." in prompt and '"name": "read_file"' in prompt
    assert prompt.endswith("<｜User｜>Read src/main.py<｜Assistant｜><think>")


def test_render_prompt_follows_the_sglang_thinking_flag() -> None:
    assert render_prompt({**BODY, "chat_template_kwargs": {"thinking": False}}).endswith("<｜Assistant｜></think>")
    assert render_prompt({k: v for k, v in BODY.items() if k != "chat_template_kwargs"}).endswith("<think>")


def test_parse_raw_completion_with_a_dsml_call() -> None:
    resp = parse_raw_completion(RAW, BODY)
    assert resp.reasoning == "The user wants the file."
    assert resp.content == "I'll read it."
    assert [(c.name, json.loads(c.arguments)) for c in resp.tool_calls] == [("read_file", {"path": "src/main.py"})]
    assert resp.finish_reason == "tool_calls"


def test_parse_raw_completion_decodes_non_string_parameters() -> None:
    [call] = parse_raw_completion(EDIT_RAW, BODY).tool_calls
    assert json.loads(call.arguments) == {"path": "a.py", "edits": [{"old": "x = 1", "new": "x = 2"}]}


def test_parse_raw_completion_keeps_prose_and_drops_the_eos() -> None:
    resp = parse_raw_completion("Hmm.</think>All tests pass.<｜end▁of▁sentence｜>", BODY)
    assert (resp.content, resp.tool_calls, resp.finish_reason) == ("All tests pass.", [], "stop")


@pytest.mark.parametrize(
    ("raw", "content", "calls", "finish"),
    [
        # variants the reference parser does not know stay in the content
        ("</think>" + BLOCK.replace("｜", "|"), BLOCK.replace("｜", "|"), [], "stop"),
        ("</think>" + BLOCK.replace("DSML", "dsml"), BLOCK.replace("DSML", "dsml"), [], "stop"),
        # spaced tags and V3.2's block name parse
        ("</think>" + BLOCK.replace("<｜DSML｜tool_calls>", "<｜DSML｜ tool_calls>"), "", ["read_file"], "tool_calls"),
        ("</think>" + BLOCK.replace("tool_calls", "function_calls"), "", ["read_file"], "tool_calls"),
        # unterminated block still yields its call
        ("</think>" + BLOCK.removesuffix("</｜DSML｜tool_calls>"), "", ["read_file"], "tool_calls"),
        # a stray marker in prose swallows the rest of the text
        ("</think>Use the <｜DSML｜ marker wisely. Done.", "Use the", [], "stop"),
        # text after the block is dropped
        ("</think>" + BLOCK + "\nAnything else?", "", ["read_file"], "tool_calls"),
    ],
)
def test_reference_parser_behaviour_on_malformed_dsml(raw: str, content: str, calls: list, finish: str) -> None:
    resp = parse_raw_completion(raw, BODY)
    assert (resp.content.strip(), [c.name for c in resp.tool_calls], resp.finish_reason) == (content, calls, finish)


def test_bad_json_in_a_non_string_parameter_is_pasted_verbatim() -> None:
    raw = "</think>" + BLOCK.replace('"path" string="true">src/main.py', '"max_lines" string="false">5x')
    [call] = parse_raw_completion(raw, BODY).tool_calls
    assert call.arguments == '{"max_lines": 5x}'


def _server(**kw):
    return turn(**kw, raw=RAW, tools=TOOLS)


def test_oracle_agrees_with_a_correct_server() -> None:
    ctx = _server(
        content="I'll read it.", reasoning="The user wants the file.", calls=[("read_file", '{"path":"src/main.py"}')]
    )
    assert check_parser_disagreement(ctx) == []


def test_oracle_compares_arguments_as_json_not_text() -> None:
    ctx = turn(calls=[("edit_file", '{"edits": [{"new": "x = 2", "old": "x = 1"}], "path": "a.py"}')], raw=EDIT_RAW)
    assert check_parser_disagreement(ctx) == []


def test_oracle_reports_different_arguments() -> None:
    ctx = _server(content="I'll read it.", calls=[("read_file", {"path": "src/main.pyc"})])
    [v] = check_parser_disagreement(ctx)
    assert v.code == ORACLE_CODE and v.where == "tool_calls[0].arguments"
    assert 'oracle saw \'{"path": "src/main.py"}\'' in v.detail and "src/main.pyc" in v.detail


def test_oracle_reports_dsml_leaked_into_content() -> None:
    ctx = _server(content="I'll read it.\n\n" + BLOCK, finish="stop")
    verdicts = check_parser_disagreement(ctx)
    assert [v.where for v in verdicts] == ["tool_calls", "content"]
    assert verdicts[0].detail == "tool call names: oracle saw ['read_file'], server sent []"
    assert "oracle saw" in verdicts[1].detail and "<｜DSML｜tool_calls>" in verdicts[1].detail


def test_oracle_reports_a_dropped_call_and_changed_content() -> None:
    ctx = _server(content="I will read it.", calls=[])
    details = [v.detail for v in check_parser_disagreement(ctx)]
    assert details[0] == "tool call names: oracle saw ['read_file'], server sent []"
    assert details[1].startswith("content differs at 1:")


def test_no_raw_completion_no_oracle() -> None:
    assert check_parser_disagreement(turn("anything")) == []


@pytest.mark.parametrize(
    ("a", "b", "equal"),
    [
        (5, 5.0, True),
        (True, 1, False),
        ({"a": [1, {"b": None}]}, {"a": [1, {"b": None}]}, True),
        ("1", 1, False),
        ([1, 2], [2, 1], False),
    ],
)
def test_json_equal(a, b, equal: bool) -> None:
    assert json_equal(a, b) is equal
