"""What the request asked of the answer, checked on literal turns: tool_choice, parallel tool
calls, stop sequences, and a thinking turn that ends inside its reasoning."""

from __future__ import annotations

import dataclasses

import pytest

from dsv4bench.checks import run_checks
from dsv4bench.checks.request_compliance import (
    check_parallel_calls_violation,
    check_reasoning_only,
    check_stop_sequence_ignored,
    check_tool_choice_violation,
)
from dsv4bench.history.records import TurnContext
from dsv4bench.history.request_terms import RequestTerms

from .turns import BLOCK, turn

READ = ("read_file", {"path": "a.py"})
LIST = ("list_services", {})
CHECKS = (
    check_tool_choice_violation,
    check_parallel_calls_violation,
    check_stop_sequence_ignored,
    check_reasoning_only,
)


def asked(ctx: TurnContext, **body: object) -> TurnContext:
    """`ctx` as the answer to a request whose body held `body`'s fields."""
    terms = RequestTerms.of_body({"messages": [], **body})
    return dataclasses.replace(ctx, terms=terms, thinking=terms.thinking)


NAMED_READ = {"tool_choice": {"type": "function", "function": {"name": "read_file"}}}

CLEAN = {
    "none, prose": asked(turn("The answer is 42."), tool_choice="none"),
    "required, one call": asked(turn(calls=[READ]), tool_choice="required"),
    "required, two calls": asked(turn(calls=[READ, LIST]), tool_choice="required"),
    "named, that tool": asked(turn(calls=[READ]), **NAMED_READ),
    "named, that tool twice": asked(turn(calls=[READ, READ]), **NAMED_READ),
    "auto, no call": asked(turn("Done.")),
    "parallel false, one call": asked(turn(calls=[READ]), parallel_tool_calls=False),
    "parallel true, two calls": asked(turn(calls=[READ, LIST]), parallel_tool_calls=True),
    "parallel unset, two calls": asked(turn(calls=[READ, LIST])),
    "stop set, not in the text": asked(turn("Thought: read it.", calls=[READ]), stop=["\nObservation:"]),
    "stop text in arguments only": asked(
        turn(calls=[("run_shell", {"command": "echo Observation:"})]), stop=["Observation:"]
    ),
    "thinking, reasoning then prose": asked(turn("Done.", reasoning="Let me think."), reasoning_effort="high"),
    "thinking, reasoning then a call": asked(turn(calls=[READ], reasoning="Read it first."), reasoning_effort="max"),
    "required, cut by the length limit": asked(turn("", finish="length"), tool_choice="required"),
    "thinking, cut inside the reasoning": asked(
        turn("", reasoning="Step 1...", finish="length"), reasoning_effort="max"
    ),
    # Reasoning only, where the request allowed it: its own stop sequence may match inside the
    # reasoning (the server cuts there and never sends it) ...
    "reasoning only, the request's stop may have ended it": asked(
        turn("", reasoning="Thought: read a.py"), stop=["\nObservation:"], reasoning_effort="high"
    ),
    # ... or it continues an assistant message it prefilled (DeepSeek's prefix, vLLM's
    # continue_final_message): the answer's content is partly the client's own.
    "reasoning only, continuing a prefilled assistant message": asked(
        turn("", reasoning="So the rest follows."),
        reasoning_effort="high",
        messages=[{"role": "user", "content": "Sum 2+2"}, {"role": "assistant", "content": "4", "prefix": True}],
    ),
    "reasoning only, continue_final_message": asked(
        turn("", reasoning="Done."), continue_final_message=True, reasoning_effort="high"
    ),
}


@pytest.mark.parametrize("ctx", CLEAN.values(), ids=CLEAN.keys())
def test_answers_that_keep_their_terms_pass(ctx: TurnContext) -> None:
    for check in CHECKS:
        assert check(ctx) == [], check.__name__


CAUGHT = {
    # SGLang with tool_choice "none" skips its parser, yet a call came back parsed.
    "none, a call": (
        asked(turn(calls=[READ]), tool_choice="none"),
        "tool_choice_violation",
        "tool_choice 'none' but 1",
    ),
    "required, prose": (
        asked(turn("I think we are done."), tool_choice="required"),
        "tool_choice_violation",
        "'required' but no tool call",
    ),
    "required, empty": (asked(turn(""), tool_choice="required"), "tool_choice_violation", "no tool call"),
    "named, no call": (
        asked(turn("Sure."), **NAMED_READ),
        "tool_choice_violation",
        "names 'read_file' but no tool call",
    ),
    "named, another tool": (asked(turn(calls=[LIST]), **NAMED_READ), "tool_choice_violation", "called 'list_services'"),
    "named, another tool beside it": (
        asked(turn(calls=[READ, LIST, LIST]), **NAMED_READ),
        "tool_choice_violation",
        "called 'list_services' and 1 other(s)",
    ),
    "parallel false, two calls": (
        asked(turn(calls=[READ, LIST]), parallel_tool_calls=False),
        "parallel_calls_violation",
        "but 2 tool calls",
    ),
    "stop in content": (
        asked(turn("Thought: read.\nObservation: the file says"), stop=["\nObservation:"]),
        "stop_sequence_ignored",
        "in content",
    ),
    "stop in reasoning": (
        asked(turn("Done.", reasoning="a\nObservation: b"), stop="\nObservation:", reasoning_effort="low"),
        "stop_sequence_ignored",
        "in reasoning",
    ),
    "deep effort, reasoning only": (
        asked(turn("", reasoning="Let me consider every path..."), reasoning_effort="max"),
        "reasoning_only",
        "reasoning_effort 'max'",
    ),
    "reasoning only, whitespace content": (
        asked(turn("\n\n", reasoning="Thinking."), chat_template_kwargs={"thinking": True}),
        "reasoning_only",
        "then nothing",
    ),
    # What does not allow an answer to end in its reasoning: tool_choice "none" owes a text
    # answer; a user message last (an assistant message earlier in the history is no prefill).
    "reasoning only under tool_choice none": (
        asked(turn("", reasoning="No tools, so..."), tool_choice="none", reasoning_effort="high"),
        "reasoning_only",
        "then nothing",
    ),
    "reasoning only, no tools offered": (
        asked(turn("", reasoning="Let me think.", tools={}), reasoning_effort="low"),
        "reasoning_only",
        "then nothing",
    ),
    "reasoning only, an earlier assistant turn": (
        asked(
            turn("", reasoning="Hmm."),
            reasoning_effort="high",
            messages=[
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": "b"},
                {"role": "user", "content": "c"},
            ],
        ),
        "reasoning_only",
        "then nothing",
    ),
}


@pytest.mark.parametrize(("ctx", "code", "says"), CAUGHT.values(), ids=CAUGHT.keys())
def test_each_broken_term_is_caught_under_its_code(ctx: TurnContext, code: str, says: str) -> None:
    verdicts, errors = run_checks(ctx)
    assert errors == []
    found = [v for v in verdicts if v.code == code]
    assert len(found) == 1 and says in found[0].detail, verdicts


def test_dsml_left_in_content_under_none_is_the_dsml_leak() -> None:
    """The leak only "none" shows (the parser skipped) is dsml_leak_content, not a second code."""
    verdicts, _ = run_checks(asked(turn(f"Checking.\n\n{BLOCK}"), tool_choice="none"))
    codes = {v.code for v in verdicts}
    assert "dsml_leak_content" in codes and "tool_choice_violation" not in codes


@pytest.mark.parametrize(
    "body",
    [
        {"tool_choice": 7},
        {"tool_choice": {"type": "function"}},
        {"tool_choice": {"function": "x"}},
        {"parallel_tool_calls": "no"},
        {"stop": 5},
        {"stop": [1, None, ""]},
        {"reasoning_effort": ["max"]},
        {"chat_template_kwargs": "x"},
        {"thinking": {"type": "maybe"}},
    ],
)
def test_odd_request_fields_read_as_not_set(body: dict) -> None:
    terms = RequestTerms.of_body({"messages": [], **body})
    assert terms.variant() == {
        "tool_choice": "auto",
        "parallel_tool_calls": "unset",
        "thinking": "unset",
        "stop": "none",
    }
    assert RequestTerms.of_body("not a body") == RequestTerms()


def test_terms_read_as_the_servers_read_them_and_round_trip() -> None:
    terms = RequestTerms.of_body(
        {
            "tool_choice": {"type": "function", "function": {"name": "read_file"}},
            "parallel_tool_calls": False,
            "reasoning_effort": "xhigh",
            "chat_template_kwargs": {"thinking": False},
            "stop": "\nObservation:",
        }
    )
    # deepseek-recipe turns thinking on for a reasoning_effort, whatever chat_template_kwargs says.
    assert terms.thinking is True and terms.named_tool == "read_file" and terms.stop == ("\nObservation:",)
    assert terms.variant() == {
        "tool_choice": "named",
        "parallel_tool_calls": "false",
        "thinking": "xhigh",
        "stop": "set",
    }
    assert RequestTerms.from_json(terms.to_json()) == terms
    assert RequestTerms.of_body({"thinking": {"type": "enabled"}}).variant()["thinking"] == "on"
    assert RequestTerms.of_body({"chat_template_kwargs": {"enable_thinking": False}}).variant()["thinking"] == "off"


def test_a_turn_cut_at_its_cap_is_not_also_a_broken_term() -> None:
    """Cut by max_tokens while its finish_reason says "stop": finish_reason_mismatch owns it, so
    neither reasoning_only nor a "required" tool_choice restates the cut."""
    for ctx in (
        asked(turn("", reasoning="Step 1, step 2"), reasoning_effort="max"),
        asked(turn("I will call read_file"), tool_choice="required"),
    ):
        ctx.response.usage = {"completion_tokens": 512}
        verdicts, errors = run_checks(dataclasses.replace(ctx, max_tokens=512))
        assert errors == [] and [v.code for v in verdicts] == ["finish_reason_mismatch"], verdicts
        # one token short of the cap, the same answer is the broken term it looks like
        verdicts, _ = run_checks(dataclasses.replace(ctx, max_tokens=513))
        assert {v.code for v in verdicts} & {"reasoning_only", "tool_choice_violation"}, verdicts


@pytest.mark.parametrize(
    ("body", "continues"),
    [
        ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}, True),
        ({"messages": [{"role": "user", "content": "a"}], "continue_final_message": True}, True),
        ({"messages": [{"role": "user", "content": "a"}]}, False),
        ({"messages": [{"role": "assistant", "content": "b"}, {"role": "tool", "content": "c"}]}, False),
        ({"messages": [], "continue_final_message": "yes"}, False),
        ({"messages": ["assistant"]}, False),
        ({"messages": "x"}, False),
    ],
)
def test_continues_assistant_is_read_from_the_body_and_round_trips(body: dict, continues: bool) -> None:
    terms = RequestTerms.of_body(body)
    assert terms.continues_assistant is continues
    assert RequestTerms.from_json(terms.to_json()) == terms
    # written only when set, so the summary of an ordinary request keeps its shape
    assert ("continues_assistant" in terms.to_json()) is continues
