"""Scenario packs: tools, virtual worlds, task generators, expert policies.

`FAMILIES` is the registry; `play_expert` runs the scripted expert against a fresh world,
which gives tests a solved session, the harness the expert's final state, and the engine's
trainer its transcripts (`session_messages`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .base import (
    Observation,
    ScenarioFamily,
    Step,
    Task,
    World,
    format_tool_error,
    is_error,
    observations_from_messages,
)
from .call_gate import CallGate
from .coding import CodingFamily
from .data import DataFamily
from .ops import OpsFamily
from .transcript import CallText, assistant_message, default_call_id, opening_messages, tool_message, transcript_chars

__all__ = [
    "FAMILIES",
    "ExpertSession",
    "family_for_session",
    "format_tool_error",
    "get_family",
    "is_error",
    "observations_from_messages",
    "play_expert",
    "run_expert_session",
    "session_messages",
    "task_solved",
    "transcript_chars",
]

FAMILIES: dict[str, ScenarioFamily] = {f.name: f for f in (CodingFamily(), DataFamily(), OpsFamily())}

MIXED = "mixed"


def get_family(name: str) -> ScenarioFamily:
    """The registered family called `name`."""
    try:
        return FAMILIES[name]
    except KeyError:
        known = ", ".join(sorted(FAMILIES))
        raise KeyError(f"unknown scenario family {name!r}; known: {known} (or {MIXED!r})") from None


def family_for_session(scenario: str, index: int) -> ScenarioFamily:
    """The family session `index` runs: `scenario` itself, or round-robin over all for "mixed"."""
    if scenario == MIXED:
        names = list(FAMILIES)
        return FAMILIES[names[index % len(names)]]
    return get_family(scenario)


@dataclass
class ExpertSession:
    """One session played by the expert: its steps and, per step, what the calls returned."""

    family: ScenarioFamily
    task: Task
    world: World
    steps: list[Step] = field(default_factory=list)
    results: list[list[Observation]] = field(default_factory=list)

    @property
    def observations(self) -> list[Observation]:
        return [o for turn in self.results for o in turn]

    @property
    def final(self) -> str | None:
        return self.steps[-1].final if self.steps and self.steps[-1].is_final else None


def play_expert(
    family: ScenarioFamily | str, seed: int, max_turns: int = 16, alter: Callable[[int, Step], Step] | None = None
) -> ExpertSession:
    """Play the expert against a fresh world for at most `max_turns` assistant turns.

    `alter(turn, step)` may replace the expert's step of a turn (training data uses it to
    plant a slip the expert then recovers from)."""
    fam = get_family(family) if isinstance(family, str) else family
    world = fam.build_world(seed)
    session = ExpertSession(fam, fam.make_task(world, seed), world)
    gate = CallGate(fam.tool_schemas())  # a slipped call is refused as the harness refuses it
    seen: list[Observation] = []
    for n in range(max_turns):
        step = fam.expert_step(session.task, list(seen))
        if alter is not None:
            step = alter(n, step)
        session.steps.append(step)
        if step.is_final:
            session.results.append([])
            break
        turn = [Observation(a, gate.run(world, a.name, json.dumps(a.arguments))) for a in step.calls]
        session.results.append(turn)
        seen += turn
    return session


def task_solved(task: Task, world: World) -> bool:
    """Whether `world` is in a state that solves `task` (the evaluator's verdict, not the digest's)."""
    return get_family(task.family).solved(task, world)


def run_expert_session(family: ScenarioFamily | str, seed: int, max_turns: int = 16) -> tuple[Task, list[Step], str]:
    """(task, the expert's steps, the digest of the world it leaves behind)."""
    s = play_expert(family, seed, max_turns)
    return s.task, s.steps, s.world.digest()


def session_messages(session: ExpertSession, upto: int | None = None) -> list[dict[str, Any]]:
    """The session as an OpenAI chat transcript (system, user, then assistant/tool turns).

    `upto` keeps only the first `upto` assistant turns, with their results.
    """
    msgs = opening_messages(session.family.system_prompt, session.task.prompt)
    for n, (step, turn) in enumerate(zip(session.steps, session.results)):
        if upto is not None and n >= upto:
            break
        if step.is_final:
            msgs.append(assistant_message(step.final or ""))
            continue
        calls = [
            CallText(default_call_id(n, i), a.name, json.dumps(a.arguments, ensure_ascii=False))
            for i, a in enumerate(step.calls)
        ]
        msgs.append(assistant_message("", calls))
        msgs += [tool_message(c.id, o.result) for c, o in zip(calls, turn)]
    return msgs
