"""Special-token leaks on literal turns: the shapes of real reports caught, clean look-alikes passed."""

from __future__ import annotations

import json

import pytest

from dsv4bench.checks import run_checks
from dsv4bench.checks.special_tokens import (
    TOKENS,
    bundled_tokens,
    check_special_token_leak,
    find_special_tokens,
    recipe_tokens,
)
from dsv4bench.wire.sse import DeltaAssembler

from .turns import BLOCK, turn

BOS, EOS, THINK, END_THINK = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<think>", "</think>"

LEAKS = {
    "EOS streamed after the answer (speculative decoding)": "All tests pass." + EOS,
    "BOS streamed before the answer": BOS + "All tests pass.",
    "BOS and EOS around an answer": BOS + "Done." + EOS + BOS,
    "end of thinking left in content": "The user wants the log level.</think>I'll set it to debug.",
    "content opening with the end of thinking": END_THINK + "I'll set it to debug.",
    "start of thinking in content": THINK + "Let me plan this.",
    "role token as the model runs on": "Done.<｜User｜>Now fix the tests.<｜Assistant｜>",
    "latest reminder token": "<｜latest_reminder｜>Keep going.",
    "grounding tokens": "The button is at <｜box｜>(10,20),(30,40)<｜/box｜>.",
    "image token": "Here: <｜image｜>",
    "backticked token absent from the request": "The model stops at `<｜end▁of▁sentence｜>`.",
    "ASCII-bar spelling": "Done.<|end▁of▁sentence|>",
    "ASCII spelling with underscores": "Done.<|end_of_sentence|>",
    "spaced, doubled bars": "Done.< ||begin of sentence|| >",
    "a token cut at the end (split across chunks)": "Done.<｜end▁of",
    "token beside a DSML block": BLOCK + EOS,
}

CLEAN = {
    "prose about DSML": "DeepSeek's DSML format wraps tool calls in special tags; the server parses DSML.",
    "fullwidth bar in Chinese prose": "请选择一个方案：选项A｜选项B｜选项C。",
    "fullwidth bar table": "｜ 名称 ｜ 数值 ｜\n｜ 温度 ｜ 25 ｜",
    "lone fullwidth bar": "a ｜ b",
    "the word think": "I think the fix is to think about the cache first.",
    "thinking tags of other formats": "<thinking>plan</thinking> and <think /> and < think>",
    "html and generics": '<div class="think">x</div> Vec<Think>',
    "a cut spelling mid-text is not a token": "<｜end▁of the list",
    "byte-level form is garbled_text's": "<ï½ľendâĸģofâĸģsentenceï½ľ>",
}


def test_both_sources_are_found_and_agree() -> None:
    recipe, bundled = recipe_tokens(), bundled_tokens()
    assert len(recipe) == len(bundled) == 18 and set(recipe) == set(bundled)
    assert recipe[EOS] == "Eos" and recipe[END_THINK] == "ThinkingEnd"
    assert set(TOKENS) == set(recipe) - {"｜DSML｜"}  # the DSML marker is dsml.py's finding


@pytest.mark.parametrize("text", LEAKS.values(), ids=LEAKS.keys())
def test_leak_in_content_is_flagged_once_with_offset(text: str) -> None:
    [v] = check_special_token_leak(turn(text))
    offset = int(v.where.removeprefix("content@"))
    assert v.code == "special_token_leak" and text[offset:].startswith("<")
    # the same turn from a DeepSeek server (its family known) is judged the same
    assert [x.code for x in check_special_token_leak(turn(text, family="deepseek-v4"))] == ["special_token_leak"]


def test_other_families_tokens_are_not_deepseeks() -> None:
    """On a DeepSeek server, ChatML's tokens are text the model wrote, not DeepSeek special tokens;
    where the family is unknown every family's tokens count."""
    text = "<|endoftext|> <|im_start|>assistant <s></s>"
    assert check_special_token_leak(turn(text, family="deepseek-v4")) == []
    assert [v.code for v in check_special_token_leak(turn(text))] == ["special_token_leak"]


@pytest.mark.parametrize("text", CLEAN.values(), ids=CLEAN.keys())
def test_clean_text_passes_everywhere(text: str) -> None:
    ctx = turn(text, reasoning=text, calls=[("run_shell", {"command": f"echo {text!r}"})])
    assert find_special_tokens(text) == [] and check_special_token_leak(ctx) == []


def test_end_of_thinking_in_content_with_thinking_off_names_the_flag() -> None:
    ctx = turn(END_THINK + "Let me look into that.")
    ctx.thinking = False
    [v] = check_special_token_leak(ctx)
    assert v.where == "content@0" and "ThinkingEnd" in v.detail and "thinking off" in v.detail


def test_end_of_thinking_in_content_with_thinking_on_is_the_reasoning_parser_missing_it() -> None:
    ctx = turn("The user wants the file.</think>I'll read it.")
    ctx.thinking = True
    [v] = check_special_token_leak(ctx)
    assert v.where == "content@24" and "reasoning parser missed it" in v.detail


def test_verdict_does_not_depend_on_the_thinking_flag() -> None:
    codes = []
    for thinking in (True, False, None):
        ctx = turn(END_THINK + "ok")
        ctx.thinking = thinking
        codes.append([v.code for v in check_special_token_leak(ctx)])
    assert codes == [["special_token_leak"]] * 3


@pytest.mark.parametrize(
    "reasoning",
    [
        "I should read the file first." + EOS,
        "Plan: read it.</think>",
        "The user asked.<｜Assistant｜>I will now",
    ],
)
def test_leak_in_reasoning(reasoning: str) -> None:
    [v] = check_special_token_leak(turn("Done.", reasoning=reasoning))
    assert v.where.startswith("reasoning@")


@pytest.mark.parametrize(
    "arguments",
    [
        json.dumps({"path": "src/main.py" + EOS}, ensure_ascii=False),
        json.dumps({"path": "src/main.py" + EOS}, ensure_ascii=True),  # \uff5c escapes: seen decoded
        '{"command": "ls <\\/think>"}',  # a JSON-escaped slash
        '{"path": "a.py"}' + EOS,  # not JSON: judged raw
    ],
)
def test_leak_in_arguments(arguments: str) -> None:
    [v] = check_special_token_leak(turn(calls=[("list_services", {}), ("read_file", arguments)]))
    assert v.where == "tool_calls[1].arguments"


def test_one_verdict_per_text_counting_the_rest() -> None:
    ctx = turn(BOS + "a" + EOS + "b" + EOS, reasoning=THINK + "x" + END_THINK, calls=[("read_file", {"path": EOS})])
    verdicts = check_special_token_leak(ctx)
    assert [v.where.split("@")[0] for v in verdicts] == ["content", "reasoning", "tool_calls[0].arguments"]
    assert "(+2 more)" in verdicts[0].detail


def test_token_split_across_stream_chunks_is_caught_once_assembled() -> None:
    asm = DeltaAssembler()
    pieces = ["All tests pass.<｜end", "▁of▁sen", "tence｜>"]
    for piece in pieces:
        asm.feed(json.dumps({"id": "c", "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}))
    asm.feed(json.dumps({"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
    asm.feed("[DONE]")
    ctx = turn()
    ctx.response = asm.finish()
    [v] = check_special_token_leak(ctx)
    assert v.where == "content@15" and "Eos" in v.detail


def test_a_special_token_counts_once_across_the_checkers() -> None:
    """Neither the DSML codes nor garbled_text flag a special token: it is this code's finding."""
    for text in (EOS, BOS + "x", END_THINK + "x", "<｜User｜>"):
        verdicts, errors = run_checks(turn(text, reasoning=text))
        assert not errors and {v.code for v in verdicts} == {"special_token_leak"}, (text, verdicts)
