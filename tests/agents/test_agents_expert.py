"""The scripted expert: valid calls, sessions of the right length and size, tasks solved."""

from __future__ import annotations

import functools
import statistics

import pytest
from jsonschema import Draft202012Validator

from dsv4bench.agents import (
    FAMILIES,
    ExpertSession,
    is_error,
    observations_from_messages,
    play_expert,
    session_messages,
    task_solved,
    transcript_chars,
)
from dsv4bench.agents.base import Observation, ToolAction

NAMES = list(FAMILIES)
SEEDS = range(30)


@functools.cache
def sessions(name: str) -> tuple[ExpertSession, ...]:
    return tuple(play_expert(name, seed) for seed in SEEDS)


@pytest.mark.parametrize("name", NAMES)
def test_every_call_validates_and_executes(name: str) -> None:
    validators = {n: Draft202012Validator(s) for n, s in FAMILIES[name].tool_schemas().items()}
    for s in sessions(name):
        for o in s.observations:
            validators[o.action.name].validate(o.action.arguments)
            assert not is_error(o.result), (s.task.seed, o.action, o.result)


@pytest.mark.parametrize("name", NAMES)
def test_sessions_end_with_an_answer_in_6_to_12_turns(name: str) -> None:
    for s in sessions(name):
        assert s.final, s.task.seed
        assert 6 <= len(s.steps) <= 12, (s.task.seed, len(s.steps))
        assert all(1 <= len(step.calls) <= 2 for step in s.steps[:-1])


@pytest.mark.parametrize("name", NAMES)
def test_transcripts_grow_to_thousands_of_tokens(name: str) -> None:
    at8 = [transcript_chars(session_messages(s, upto=8)) for s in sessions(name)]
    total = [transcript_chars(session_messages(s)) for s in sessions(name)]
    assert statistics.median(at8) > 12_000, sorted(at8)
    assert statistics.median(total) >= 13_000 and max(total) <= 45_000, sorted(total)


def _solved(s: ExpertSession) -> bool:
    return task_solved(s.task, s.world)


@pytest.mark.parametrize("name", NAMES)
def test_the_expert_solves_the_task(name: str) -> None:
    unsolved = [s.task.seed for s in sessions(name) if not _solved(s)]
    assert not unsolved


def test_solved_is_what_the_brief_means() -> None:
    """coding: the suite passes; data: the reported value is the expected one; ops: remediated, severity right."""
    for s in sessions("coding"):
        assert "failed" not in s.world.execute("run_tests", {"verbosity": "quiet"})
    for s in sessions("data"):
        assert s.world.reports[0]["findings"][0]["value"] == s.task.goal["expected"]  # type: ignore[attr-defined]  # World names only what every family's has
    for s in sessions("ops"):
        fleet, goal = s.world.fleet, s.task.goal  # type: ignore[attr-defined]  # World names only what every family's has
        assert fleet.services[goal["root"]]["fault"] is None and fleet.services[goal["symptom"]]["status"] == "healthy"
        assert [i["severity"] for i in fleet.incidents] == [goal["severity"]]


@pytest.mark.parametrize("name", NAMES)
def test_unsolved_world_is_not_solved(name: str) -> None:
    """The evaluation above is not vacuous: a session cut before remediation fails it."""
    s = play_expert(name, 0, max_turns=4)
    assert not _solved(s)


@pytest.mark.parametrize("name", NAMES)
def test_policy_replays_from_an_openai_transcript(name: str) -> None:
    fam = FAMILIES[name]
    for s in sessions(name)[:10]:
        for k, step in enumerate(s.steps):
            seen = observations_from_messages(session_messages(s, upto=k))
            assert fam.expert_step(s.task, seen) == step, (s.task.seed, k)


@pytest.mark.parametrize("name", NAMES)
def test_errors_everywhere_still_end_in_an_answer(name: str) -> None:
    """A model (or server) that turns every result into an error must not make the expert loop or raise."""
    fam = FAMILIES[name]
    for seed in range(5):
        task = fam.make_task(fam.build_world(seed), seed)
        seen: list[Observation] = []
        for _ in range(30):
            step = fam.expert_step(task, seen)
            if step.is_final:
                break
            seen += [Observation(a, "Error: upstream tool crashed") for a in step.calls]
        assert step.is_final and step.final


@pytest.mark.parametrize("name", NAMES)
def test_detours_and_garbage_do_not_derail_the_expert(name: str) -> None:
    """Foreign calls, failed calls and garbled results in between: the expert still solves the task."""
    fam = FAMILIES[name]
    for seed in range(8):
        world = fam.build_world(seed)
        task = fam.make_task(world, seed)
        seen: list[Observation] = []
        for turn in range(24):
            step = fam.expert_step(task, seen)
            if step.is_final:
                break
            if turn in (1, 4):  # a model's detour: unknown tool, garbled arguments, mangled result
                seen += [
                    Observation(ToolAction("no_such_tool", {"x": 1}), "Error: unknown tool"),
                    Observation(ToolAction(step.calls[0].name, {"garbage": True}), "Error: invalid arguments"),
                    Observation(step.calls[0], "<｜DSML｜invoke name=garbled"),
                ]
            for a in step.calls:
                seen.append(Observation(a, world.execute(a.name, dict(a.arguments))))
        assert step.is_final
        assert _solved(ExpertSession(fam, task, world)), (name, seed)
