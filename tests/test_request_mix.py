"""--request-mix: its grammar, the seeded per-turn draw, what a drawn variant writes into a body,
and a session that sends a thinking turn's reasoning back."""

from __future__ import annotations

from collections import Counter

import pytest

from dsv4bench.harness.config import ConfigError, RunConfig
from dsv4bench.history.records import AssembledResponse, ToolCall, TurnStatus
from dsv4bench.harness.request_mix import PRESETS, STOP_SEQUENCES, RequestMix, RequestMixError, apply
from dsv4bench.history.request_terms import RequestTerms
from dsv4bench.harness.session import AgentSession, SessionConfig

from .test_session import CounterFamily

TOOLS = ["read_file", "list_dir", "run_tests"]


def test_a_preset_and_overrides_parse() -> None:
    mix = RequestMix.parse("frameworks")
    assert dict(mix.weights) == PRESETS["frameworks"]
    over = RequestMix.parse("frameworks; thinking=off")
    assert dict(over.weights)["thinking"] == (("off", 1.0),) and over.varies == mix.varies
    alone = RequestMix.parse("tool_choice=auto:6,none:2,named")
    assert alone.varies == ("tool_choice",) and dict(alone.weights)["tool_choice"][-1] == ("named", 1.0)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("", "is empty"),
        ("fastest", "neither a preset"),
        ("tool_choice=auto;frameworks", "first only"),
        ("toolchoice=auto", "not a dimension"),
        ("tool_choice=sometimes", "not one of"),
        ("tool_choice=auto:x", "must be a number"),
        ("tool_choice=auto:-1", "at least 0"),
        ("tool_choice=auto:nan", "at least 0"),
        ("tool_choice=auto:0,none:0", "no value has a weight above 0"),
        ("thinking=high;tool_choice=required", "thinking mode refuses"),
    ],
)
def test_bad_specs_say_what_is_wrong(spec: str, says: str) -> None:
    with pytest.raises(RequestMixError, match=says):
        RequestMix.parse(spec)


def test_a_bad_spec_is_a_config_error_naming_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"--request-mix 'tool_choice=maybe' tool_choice='maybe': not one of"):
        RunConfig(url="http://127.0.0.1:1/v1", request_mix="tool_choice=maybe")
    with pytest.raises(ConfigError, match="--thinking is drawn per turn by the request mix"):
        RunConfig(url="http://127.0.0.1:1/v1", request_mix="frameworks", thinking=True)
    RunConfig(url="http://127.0.0.1:1/v1", request_mix="tool_choice=none", thinking=True)  # thinking not drawn


def test_the_draw_is_seeded_per_session_and_turn() -> None:
    mix = RequestMix.parse("frameworks")
    assert [mix.draw(7, t, TOOLS) for t in range(20)] == [mix.draw(7, t, TOOLS) for t in range(20)]
    assert [mix.draw(7, t, TOOLS) for t in range(20)] != [mix.draw(8, t, TOOLS) for t in range(20)]


def test_the_draw_follows_the_weights_and_never_sends_thinking_with_a_forced_tool() -> None:
    mix = RequestMix.parse("frameworks")
    draws = [mix.draw(seed, turn, TOOLS) for seed in range(200) for turn in range(10)]
    choices = Counter(d["tool_choice"] for d in draws)
    assert 0.62 < choices["auto"] / len(draws) < 0.80  # 70% among thinking-off turns, more among thinking ones
    assert all(d["tool_choice"] in ("auto", "none") for d in draws if d["thinking"] != "off")
    assert {d["named_tool"] for d in draws if d["tool_choice"] == "named"} == set(TOOLS)
    assert Counter(d["thinking"] for d in draws).keys() == {"off", "on", "low", "high", "max"}
    assert all(d["tool_choice"] != "named" for d in (mix.draw(1, t, []) for t in range(50)))


@pytest.mark.parametrize(
    ("drawn", "expect"),
    [
        (
            {"tool_choice": "named", "named_tool": "read_file"},
            {"tool_choice": {"type": "function", "function": {"name": "read_file"}}},
        ),
        (
            {"tool_choice": "none", "parallel_tool_calls": "false"},
            {"tool_choice": "none", "parallel_tool_calls": False},
        ),
        ({"parallel_tool_calls": "unset"}, {}),
        ({"thinking": "on"}, {"chat_template_kwargs": {"thinking": True}}),
        ({"thinking": "max"}, {"chat_template_kwargs": {"thinking": True}, "reasoning_effort": "max"}),
        ({"thinking": "off"}, {"chat_template_kwargs": {"thinking": False}}),
        ({"stop": "set"}, {"stop": list(STOP_SEQUENCES)}),
        ({"stop": "none"}, {}),
    ],
)
def test_a_variant_is_written_as_frameworks_send_it(drawn: dict, expect: dict) -> None:
    body = {"model": "m", "messages": []}
    apply(body, drawn)
    assert body == {"model": "m", "messages": [], **expect}
    terms = RequestTerms.of_body(body).variant()
    assert all(terms[d] == v for d, v in drawn.items() if d in terms and v != "set")


def _reply(reasoning: str) -> AssembledResponse:
    return AssembledResponse(
        content="", reasoning=reasoning, finish_reason="tool_calls", tool_calls=[ToolCall(0, "c0", "add", '{"n": 1}')]
    )


def test_a_session_draws_each_turn_and_sends_a_thinking_turns_reasoning_back() -> None:
    mix = RequestMix.parse("thinking=off,high")
    s = AgentSession("s1", CounterFamily(), 5, SessionConfig(model="m", max_turns=40, request_mix=mix))
    sent = []
    while len(sent) < 30:
        body = s.next_request()
        sent.append(body)
        if len(sent) > 1:
            last = [m for m in body["messages"] if m["role"] == "assistant"][-1]
            thinking_before = RequestTerms.of_body(sent[-2]).thinking
            # DeepSeek-V4's thinking mode wants the reasoning back beside the tool results.
            assert ("reasoning_content" in last) is thinking_before
            if thinking_before:
                assert last["reasoning_content"] == f"thought {len(sent) - 2}"
        s.observe(TurnStatus.OK, _reply(f"thought {len(sent) - 1}"), [])
    efforts = Counter(b.get("reasoning_effort") for b in sent)
    assert efforts[None] and efforts["high"]
    assert all(b["tool_choice"] == "auto" for b in sent)  # tool_choice not in the mix: as before
