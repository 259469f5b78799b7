"""Context profiles: depths drawn from recorded agents' figures, openings of real reads, and the
sessions that grow to their depth and stop there."""

import json
import statistics

import pytest

from dsv4bench.agents import FAMILIES
from dsv4bench.agents.base import is_error
from dsv4bench.agents.call_gate import CallGate
from dsv4bench.agents.transcript import transcript_chars
from dsv4bench.agents.exploration import exploration
from dsv4bench.harness.config import ConfigError, RunConfig
from dsv4bench.harness.context_profile import (
    CHARS_PER_TOKEN,
    MIN_DEPTH_TOKENS,
    PROFILES,
    SHORT,
    SWE,
    ContextProfileError,
    parse_context,
)
from dsv4bench.harness.opening_reads import opening_reads
from dsv4bench.harness.session import AgentSession, EndReason, SessionConfig
from dsv4bench.history.records import AssembledResponse, ToolCall, TurnStatus

URL = "http://127.0.0.1:9/v1"


def _quantile(values: list[int], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


@pytest.mark.parametrize("profile", [p for p in PROFILES.values() if p.grows])
def test_each_profile_draws_its_recorded_median_and_p95(profile):
    depths = [profile.depth_for(seed) for seed in range(4000)]
    assert abs(_quantile(depths, 50) / profile.p50 - 1) < 0.05
    assert abs(_quantile(depths, 95) / profile.p95 - 1) < 0.08
    assert profile.source  # every profile says where its figures come from


def test_a_session_draws_the_same_depth_every_time_and_sessions_differ():
    assert SWE.depth_for(7) == SWE.depth_for(7)
    assert len({SWE.depth_for(s) for s in range(50)}) > 45
    assert SHORT.depth_for(7) is None and not SHORT.grows


@pytest.mark.parametrize(
    "text, p50, p95",
    [("24000", 24000, round(24000 * 69_274 / 23_840)), ("24k,70k", 24000, 70000), (" 1.5M,2m ", 1_500_000, 2_000_000)],
)
def test_a_custom_profile_is_a_median_and_an_optional_p95(text, p50, p95):
    profile = parse_context(text)
    assert (profile.p50, profile.p95) == (p50, p95)
    assert parse_context(profile.name) == profile  # its name reads back as itself (run.json, the plan)


@pytest.mark.parametrize("text", ["long", "", "24k,", "0", "-5k", "nan", "inf", "24k,10k", "1k", "1,2,3", "k"])
def test_a_bad_context_is_one_clear_error(text):
    with pytest.raises(ContextProfileError, match="--context"):
        parse_context(text)


def test_runconfig_says_a_bad_context_as_its_flag_and_takes_the_profiles_turns():
    with pytest.raises(ConfigError, match="--context"):
        RunConfig(url=URL, context="huge")
    assert RunConfig(url=URL).turns_per_session == SessionConfig.max_turns
    assert RunConfig(url=URL, context="swe").turns_per_session == SWE.max_turns
    assert RunConfig(url=URL, context="swe", max_turns=5).turns_per_session == 5


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_read_of_every_family_is_read_only_and_answered(family):
    fam = FAMILIES[family]
    world = fam.build_world(3)
    before = world.digest()
    gate = CallGate(fam.tool_schemas())
    reads = exploration(family, world)
    more = [next(reads.more) for _ in range(60)]
    for action in reads.first + more:
        result = gate.run(world, action.name, json.dumps(action.arguments))
        assert not is_error(result), (action, result[:200])
    assert world.digest() == before  # nothing an opening reads changes the world


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_an_opening_fills_its_budget_with_real_results_and_ends_with_the_first_pass(family):
    fam = FAMILIES[family]
    world = fam.build_world(5)
    budget = 60_000
    messages = opening_reads(family, world, CallGate(fam.tool_schemas()), budget)
    results = [m["content"] for m in messages if m["role"] == "tool"]
    calls = [m["tool_calls"][0] for m in messages if m["role"] == "assistant"]
    used = sum(len(r) for r in results) + sum(
        len(c["function"]["name"]) + len(c["function"]["arguments"]) for c in calls
    )
    assert budget * 0.9 < used <= budget
    assert all(len(m["tool_calls"]) == 1 for m in messages if m["role"] == "assistant")
    ids = [c["id"] for c in calls]
    assert len(set(ids)) == len(ids) and [m["tool_call_id"] for m in messages if m["role"] == "tool"] == ids
    first = exploration(family, world).first
    tail = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls[-len(first) :]]
    assert tail == [(a.name, a.arguments) for a in first]  # the model's first turn follows its expert's reads
    # every result is what the world answers that call: no filler to skip
    for call, result in zip(calls, results):
        assert world.execute(call["function"]["name"], json.loads(call["function"]["arguments"])) == result


def test_an_opening_of_no_budget_is_empty_and_a_small_one_keeps_within_it():
    fam = FAMILIES["ops"]
    world = fam.build_world(1)
    gate = CallGate(fam.tool_schemas())
    assert opening_reads("ops", world, gate, 0) == []
    small = opening_reads("ops", world, gate, 3000)
    assert sum(len(m["content"] or "") for m in small) <= 3000
    assert opening_reads("no-such-family", world, gate, 50_000) == []


def _answer(prompt_tokens: int, final: bool = False) -> AssembledResponse:
    calls = [] if final else [ToolCall(index=0, id="c1", name="list_services", arguments='{"status": "any"}')]
    return AssembledResponse(
        content="done" if final else "",
        tool_calls=calls,
        finish_reason="stop" if final else "tool_calls",
        usage={"prompt_tokens": prompt_tokens, "completion_tokens": 20},
    )


def test_a_long_session_opens_near_its_depth_and_ends_when_it_would_pass_it():
    profile = parse_context("20k,30k")
    seed = next(s for s in range(100) if 15_000 < (profile.depth_for(s) or 0) < 40_000)
    depth = profile.depth_for(seed)
    config = SessionConfig(model="m", context_tokens=65_536, context_profile=profile)
    session = AgentSession("s0", FAMILIES["ops"], seed, config)
    assert session.depth_limit == depth
    opening = sum(len(str(m.get("content") or "")) for m in session.messages[2:])
    expected = profile.opening_chars(depth, "ops")  # less what the system prompt, task and tools take
    assert expected * 0.8 < opening <= expected
    assert len(session.next_request()["messages"]) == len(session.messages)
    session.observe(TurnStatus.OK, _answer(depth // 2), [])
    assert not session.done  # far from its depth
    session.next_request()
    session.observe(TurnStatus.OK, _answer(depth - 200), [])
    assert session.done and session.end_reason is EndReason.DEPTH_REACHED


def test_the_servers_context_bounds_a_session_before_its_drawn_depth():
    profile = parse_context("60k,80k")
    config = SessionConfig(model="m", context_tokens=16_384, context_profile=profile)
    session = AgentSession("s0", FAMILIES["data"], 2, config)
    assert session.depth_limit == 16_384
    # the whole first request (system prompt, task, tools, reads) fits the context with the turn's
    # max_tokens even at 2 characters a token, fewer than any of our worlds' content takes
    assert min(CHARS_PER_TOKEN.values()) > 2
    body = session.next_request()
    chars = transcript_chars(body["messages"]) + len(json.dumps(body["tools"]))
    assert chars / 2 + config.max_tokens < 16_384
    assert chars / 2 + config.max_tokens > 16_384 * 0.8  # and it is not cut far short
    session.observe(TurnStatus.OK, _answer(16_000), [])
    assert session.end_reason is EndReason.CONTEXT_FULL


def test_the_short_profile_opens_with_nothing_as_before():
    session = AgentSession("s0", FAMILIES["coding"], 1, SessionConfig(model="m"))
    assert [m["role"] for m in session.messages] == ["system", "user"] and session.depth_limit is None
    assert MIN_DEPTH_TOKENS < SWE.p50
