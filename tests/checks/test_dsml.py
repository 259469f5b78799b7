"""DSML leak detection on literal texts: every variant seen in the wild, and clean look-alikes."""

from __future__ import annotations

import json

import pytest

from dsv4bench.checks.dsml import check_dsml_in_arguments, check_dsml_leak_content, check_dsml_leak_reasoning, find_dsml

from .turns import BLOCK, turn

BAR_VARIANTS = ["|", "\u2223", "\u01c0", "\u2758", "\uffe8", "\u2502", "\u2503", "\u2016"]

LEAKS = {
    "canonical block after prose": "I'll read the file.\n\n" + BLOCK,
    "canonical block alone": BLOCK,
    **{f"bar U+{ord(b):04X}": BLOCK.replace("｜", b) for b in BAR_VARIANTS},
    "doubled bars": BLOCK.replace("｜DSML｜", "｜｜DSML｜｜"),
    "doubled ascii bars": BLOCK.replace("｜DSML｜", "||DSML||"),
    "mixed bars": '<|DSML｜invoke name="read_file">',
    "space after marker": "Let me check <｜DSML｜ tool_calls>",
    "space after <": 'x < ｜DSML｜invoke name="read_file">',
    "space inside tool_calls": "<｜DSML｜tool _calls>\n" + BLOCK[len("<｜DSML｜tool_calls>") :],
    "space around underscore": "<｜DSML｜tool_ calls>",
    "spaces everywhere": "< / ｜ DSML ｜ invoke >",
    "bare invoke": 'I will now call <invoke name="read_file">\n<parameter name="path">a.py</parameter>\n</invoke>',
    "bare parameter": '<parameter name="path" string="true">a.py</parameter>',
    "bare closing invoke": "done.</invoke>",
    "bare tool_calls block": "<tool_calls>\n<invoke",
    "bare function_calls block": "<function_calls>",
    "v3.2 function_calls": BLOCK.replace("tool_calls", "function_calls"),
    "unterminated block": '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="read_file">\n<｜DSML｜parameter name="path" string="true">a.py',
    "closing tag only": "Here you go.\n</｜DSML｜tool_calls>",
    "stray prefix at end": "Let me look at the file.<｜DSML｜",
    "stray marker in prose": "Reading it now ｜DSML｜ ok",
    "stray ascii marker": "Reading it now |DSML| ok",
    "marker missing its left bar": 'DSML｜invoke name="read_file"',
    "marker missing its right bar": "text ｜DSML then more",
    "cut tag at end (<｜DS)": "Let me look.<｜DS",
    "cut tag at end (</｜DSML)": "Let me look.</｜DSML",
    "cut tag at end (<｜)": "Let me look.<｜",
    "cut ascii tag at end (<|DS)": "Let me look.<|DS",
    "lower-case dsml": BLOCK.replace("DSML", "dsml"),
    "mixed-case dsml": "<｜Dsml｜invoke",
    "no bars at all": "<DSML tool_calls>",
    "string attribute alone": 'name="path" string="false">42',
    "v3 tool calls begin": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>read_file",
    "v3 tool call begin": "<｜tool▁call▁begin｜>",
    "v3 tool call end": "{}<｜tool▁call▁end｜>",
    "v3 with underscores": "<｜tool_calls_begin｜>",
}

CLEAN = {
    "chinese options with fullwidth bar": "请选择一个方案：选项A｜选项B｜选项C。",
    "chinese table with fullwidth bar": "｜ 名称 ｜ 数值 ｜\n｜ --- ｜ --- ｜\n｜ 温度 ｜ 25 ｜\n｜ 湿度 ｜ 60% ｜",
    "japanese with fullwidth bar": "これはテストです｜はい、そうです。",
    "markdown table": "| file | lines |\n|------|-------|\n| a.py | 10 |\n| b.py | 20 |",
    "shell pipeline": "ps aux | grep python | awk '{print $2}' | xargs kill -9 || true",
    "prose about invoking": "You can invoke the read_file tool; function calls and tool calls are parsed by the server.",
    "prose about dsml": "DeepSeek's DSML format wraps tool calls in special tags.",
    "other model tokens": "<|endoftext|> and <|im_start|>assistant",
    "rust closure and generics": "let calls: Vec<ToolCall> = xs.iter().map(|c| c.clone()).collect();",
    "generic named tool_calls": "fn parse() -> Vec<tool_calls> {}",
    "elixir pipe": "value |> Enum.map(&f/1) |> Enum.sum()",
    "xml with param": '<param name="x" value="1"/>\n<property name="y">2</property>',
    "html": '<div class="row">|</div>',
    "comparison at end": "if a < b and c <",
    "pipe at end": "cat log.txt |",
    "eos token": "All done.<｜end▁of▁sentence｜>",
    "box drawing table": "│ name │ size │\n├──────┼──────┤\n│ a.py │ 10   │",
    "python bitwise or": "flags = READ | WRITE | EXEC",
    "grep for dsml": "grep -ri dsml|wc -l && cat x |dsml-lint",
}


@pytest.mark.parametrize("text", LEAKS.values(), ids=LEAKS.keys())
def test_find_dsml_catches_every_variant(text: str) -> None:
    assert find_dsml(text)


@pytest.mark.parametrize("text", CLEAN.values(), ids=CLEAN.keys())
def test_find_dsml_passes_clean_text(text: str) -> None:
    assert find_dsml(text) == []


def test_find_dsml_names_the_variant_and_span() -> None:
    text = "Sure. " + BLOCK
    matches = find_dsml(text)
    assert matches[0].kind == "DSML tag <tool_calls>"
    assert matches[0].start == 6 and text[matches[0].start : matches[0].end] == matches[0].text
    assert {m.kind for m in matches} >= {"DSML tag <invoke>", "DSML tag <parameter>", "DSML tag </tool_calls>"}
    unterminated = find_dsml('<｜DSML｜tool_calls>\n<｜DSML｜invoke name="x">')
    assert unterminated[0].kind.startswith("unterminated block")


@pytest.mark.parametrize("text", LEAKS.values(), ids=LEAKS.keys())
def test_leak_in_content_is_flagged_with_excerpt_and_offset(text: str) -> None:
    verdicts = check_dsml_leak_content(turn(text))
    assert len(verdicts) == 1
    v = verdicts[0]
    assert v.code == "dsml_leak_content" and v.where.startswith("content@")
    offset = int(v.where.split("@")[1])
    assert 0 <= offset < len(text)


@pytest.mark.parametrize("text", CLEAN.values(), ids=CLEAN.keys())
def test_clean_content_and_reasoning_pass(text: str) -> None:
    ctx = turn(text, reasoning=text)
    assert check_dsml_leak_content(ctx) == []
    assert check_dsml_leak_reasoning(ctx) == []


def test_stray_prefix_beside_a_correctly_parsed_call() -> None:
    ctx = turn("I'll read it.<｜DSML｜", calls=[("read_file", {"path": "a.py"})])
    [v] = check_dsml_leak_content(ctx)
    assert "<｜DSML｜" in v.detail and v.where == "content@13"


@pytest.mark.parametrize(
    "reasoning",
    [
        "I should read the file first. " + BLOCK,
        'Plan: <｜DSML｜invoke name="run_shell">',
        "<｜tool▁calls▁begin｜>",
    ],
)
def test_leak_in_reasoning(reasoning: str) -> None:
    ctx = turn("Done.", reasoning=reasoning)
    [v] = check_dsml_leak_reasoning(ctx)
    assert v.code == "dsml_leak_reasoning" and v.where.startswith("reasoning@")
    assert check_dsml_leak_content(ctx) == []


@pytest.mark.parametrize(
    "arguments",
    [
        json.dumps({"path": "a.py", "content": "x = 1\n" + BLOCK}),
        json.dumps({"command": 'ls <｜DSML｜parameter name="x" string="true">'}, ensure_ascii=True),  # \uff5c escapes
        '{"path": "a.py</｜DSML｜parameter>\n<｜DSML｜parameter name="max_lines" string="false">5"}',
        '{"path": "a.py"}<｜DSML｜invoke name="read_file">',  # a second call glued on, not JSON
        json.dumps({"command": 'echo <invoke name="read_file">'}),
    ],
)
def test_leak_in_arguments(arguments: str) -> None:
    ctx = turn(calls=[("list_services", {}), ("read_file", arguments)])
    [v] = check_dsml_in_arguments(ctx)
    assert v.code == "dsml_in_arguments" and v.where == "tool_calls[1].arguments"


def test_escaped_leak_in_arguments_names_the_json_path() -> None:
    args = json.dumps({"command": "echo <｜DSML｜invoke"}, ensure_ascii=True)
    assert "｜" not in args
    [v] = check_dsml_in_arguments(turn(calls=[("run_shell", args)]))
    assert v.detail.startswith("in $.command: ")


@pytest.mark.parametrize(
    "args",
    [
        {"command": "ps aux | grep python | head -n 5"},
        {"path": "docs/表格.md", "content": "｜ 名称 ｜ 值 ｜\n｜ 温度 ｜ 25 ｜"},
        {"command": "echo 'invoke the tool' && make function_calls"},
        {"path": "README.md", "content": "| a | b |\n|---|---|\n| 1 | 2 |"},
    ],
)
def test_clean_arguments_pass(args: dict) -> None:
    ctx = turn(calls=[("run_shell", args), ("run_shell", json.dumps(args, ensure_ascii=True))])
    assert check_dsml_in_arguments(ctx) == []


def test_one_verdict_per_field_even_for_a_whole_block() -> None:
    ctx = turn(BLOCK + "\n" + BLOCK)
    [v] = check_dsml_leak_content(ctx)
    assert "more:" in v.detail
