"""On-policy training data: the expert takes over from states the model reaches by itself.

Expert sessions, even with planted slips (corpus.play_with_slips), only show the model
states built on the expert's own trajectory. A model drifts into states of its own making: it
lists the alerting service twice where the expert lists [symptom, root], is refused, and writes
the same call again until its turns run out, although in the expert's context it writes the
root cause with probability above 0.8 (scripts/probe_affected_services.py). The fix is the
classic one for imitation learning (DAgger): let the model play, then label the states it
reached with what the expert does from there.

A rollout is one session the model played against the real server (its OpenAI transcript, as
`AgentSession` kept it). `takeovers` finds the first turn where the model's move differs from
the expert's, and the first turn whose call was refused or failed; `expert_takeover` keeps the
model's transcript up to a chosen turn, replays its calls on a fresh world, and lets the
expert finish the session. The model's own turns from the divergence on carry no loss; the
expert's turns after the takeover do, and they are what the model learns: the move a competent
agent makes from a state the model itself got into.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

from ...agents import FAMILIES, is_error, observations_from_messages
from ...agents.base import Step, ToolAction
from ...agents.call_gate import CallGate


@dataclass(frozen=True)
class Rollout:
    """One session the model played: its family, seed, sampling temperature and transcript."""

    family: str
    seed: int
    temperature: float
    messages: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {"family": self.family, "seed": self.seed, "temperature": self.temperature, "messages": self.messages}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Rollout:
        return cls(d["family"], int(d["seed"]), float(d["temperature"]), list(d["messages"]))


class ReplayError(Exception):
    """The expert cannot take over a rollout at the turn asked for."""


class ReplayMismatch(ReplayError):
    """A rollout's recorded tool results do not match a fresh world's: it cannot be relabelled."""


def assistant_positions(messages: list[dict[str, Any]]) -> list[int]:
    """Indices of the assistant messages, one per turn the model wrote."""
    return [i for i, m in enumerate(messages) if m.get("role") == "assistant"]


def _model_step(message: dict[str, Any]) -> list[tuple[str, Any]] | None:
    """The assistant message's calls as (name, decoded arguments), [] for a final answer,
    None where some call's arguments do not decode (no expert would write it)."""
    calls = []
    for tc in message.get("tool_calls") or []:
        fn = tc.get("function") or {}
        try:
            calls.append((fn.get("name") or "", json.loads(fn.get("arguments") or "")))
        except (TypeError, ValueError):
            return None
    return calls


def _same_move(model: list[tuple[str, Any]] | None, expert: Step) -> bool:
    if model is None:
        return False
    if expert.is_final:
        return not model  # the final answer's wording may differ: ending is the move
    return model == [(a.name, a.arguments) for a in expert.calls]


def _went_wrong(messages: list[dict[str, Any]], at: int) -> bool:
    """Whether the assistant turn at message index `at` was refused, failed, or unusable: an
    error tool result, or the harness's nudge after a reply it could not use."""
    for m in messages[at + 1 :]:
        if m.get("role") == "assistant":
            break
        if m.get("role") == "user" or (m.get("role") == "tool" and is_error(str(m.get("content") or ""))):
            return True
    return False


@dataclass(frozen=True)
class Takeovers:
    """Where a rollout leaves the expert's path: turn numbers (0-based assistant turns)."""

    diverged: int | None  # first turn whose move is not the expert's
    went_wrong: int | None  # first turn whose call was refused or failed, or whose reply was unusable
    turns: int  # assistant turns in the rollout

    def points(self, rng: random.Random, later: int = 2) -> list[int]:
        """Turns at which the expert takes over: at the divergence (the state is still the
        expert's, but it is one where this model goes wrong, so its label is worth more than a
        random expert turn), right after it, right after the first turn that went wrong, and
        up to `later` turns after that (the model, refused, often makes the same call again:
        the state after two refusals is one it reaches)."""
        if self.diverged is None:
            return []
        points = {self.diverged, self.diverged + 1}
        if self.went_wrong is not None:
            points |= {self.went_wrong + 1 + k for k in range(rng.randint(0, later) + 1)}
        return sorted(p for p in points if p <= self.turns)


def takeovers(family: str, seed: int, messages: list[dict[str, Any]]) -> Takeovers:
    """Compare each of the model's turns with the expert's move from the same state."""
    fam = FAMILIES[family]
    task = fam.make_task(fam.build_world(seed), seed)
    positions = assistant_positions(messages)
    diverged = went_wrong = None
    for n, at in enumerate(positions):
        if diverged is None:
            expert = fam.expert_step(task, observations_from_messages(messages[:at]))
            if not _same_move(_model_step(messages[at]), expert):
                diverged = n
        if went_wrong is None and _went_wrong(messages, at):
            went_wrong = n
        if diverged is not None and went_wrong is not None:
            break
    return Takeovers(diverged, went_wrong, len(positions))


def expert_takeover(
    family: str, seed: int, messages: list[dict[str, Any]], turn: int, max_turns: int = 16
) -> tuple[list[dict[str, Any]], bool]:
    """The rollout's transcript up to assistant turn `turn`, then the expert's turns to the end.

    The model's calls are replayed on a fresh world through the same gate the harness uses;
    a recorded result that differs from the replay's raises ReplayError. A model turn that
    ended the session (a final answer) cannot be taken over from, nor can a session whose
    turns are used up. Returns the transcript and whether it solves the task.
    """
    fam = FAMILIES[family]
    world = fam.build_world(seed)
    task = fam.make_task(world, seed)
    gate = CallGate(fam.tool_schemas())
    positions = assistant_positions(messages)
    if not 0 <= turn <= len(positions) or turn >= max_turns:
        raise ReplayError(f"turn {turn} is not a takeover point of a {len(positions)}-turn rollout")
    end = positions[turn] if turn < len(positions) else len(messages)
    prefix = [dict(m) for m in messages[:end]]
    if prefix[-1].get("role") == "assistant":
        raise ReplayError("the model ended the session with a final answer there")
    results = {m.get("tool_call_id"): m.get("content") for m in prefix if m.get("role") == "tool"}
    for m in prefix:
        for tc in m.get("tool_calls") or []:
            fn = tc.get("function") or {}
            result = gate.run(world, fn.get("name") or "", fn.get("arguments") or "")
            if results.get(tc.get("id")) != result:
                raise ReplayMismatch(f"the replayed result of {fn.get('name')!r} differs from the recorded one")
    out = prefix
    for n in range(turn, max_turns):
        step = fam.expert_step(task, observations_from_messages(out))
        if step.is_final:
            out.append({"role": "assistant", "content": step.final or ""})
            break
        out.append(_call_message(n, step.calls))
        for i, action in enumerate(step.calls):
            result = gate.run(world, action.name, json.dumps(action.arguments))
            out.append({"role": "tool", "tool_call_id": f"call_x{n}_{i}", "content": result})
    ended = out[-1].get("role") == "assistant" and not out[-1].get("tool_calls")
    return out, ended and fam.solved(task, world)


@dataclass(frozen=True)
class RolloutScore:
    """How a rollout went, judged as the harness and the evaluation judge a session."""

    turns: int  # assistant turns
    call_turns: int  # of those, turns with at least one tool call
    bad_turns: int  # of those, turns with a call the harness's call gate refuses
    final_answer: bool  # the session ended with an answer, not with a call
    solved: bool  # the family's own check holds on a fresh world the calls were replayed on
    # (the world's state, as scripts/eval_engine.py judges it, final answer or not)


def score(rollout: Rollout) -> RolloutScore:
    """Replay the rollout's calls on a fresh world through the harness's call gate and score it."""
    fam = FAMILIES[rollout.family]
    world = fam.build_world(rollout.seed)
    task = fam.make_task(world, rollout.seed)
    gate = CallGate(fam.tool_schemas())
    turns = call_turns = bad_turns = 0
    for m in rollout.messages:
        if m.get("role") != "assistant":
            continue
        turns += 1
        calls = m.get("tool_calls") or []
        call_turns += bool(calls)
        bad = False
        for tc in calls:
            fn = tc.get("function") or {}
            name, raw = fn.get("name") or "", fn.get("arguments") or ""
            args, _ = gate.check(name, raw)
            if args is None:  # refused: the world never sees it, as in the session
                bad = True
            else:
                gate.execute(world, name, args)
        bad_turns += bad
    last = rollout.messages[-1] if rollout.messages else {}
    final = last.get("role") == "assistant" and not last.get("tool_calls")
    return RolloutScore(turns, call_turns, bad_turns, final, bool(fam.solved(task, world)))


def _call_message(n: int, calls: tuple[ToolAction, ...]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": f"call_x{n}_{i}",
                "type": "function",
                "function": {"name": a.name, "arguments": json.dumps(a.arguments, ensure_ascii=False)},
            }
            for i, a in enumerate(calls)
        ],
    }


@dataclass(frozen=True)
class Relabelled:
    """A rollout taken over by the expert at assistant turn `turn`: the transcript, and the
    model's turns that carry no loss (from its divergence up to the takeover)."""

    family: str
    seed: int
    turn: int
    messages: list[dict[str, Any]]
    no_loss: frozenset[int]


def relabel(rollout: Rollout, rng: random.Random, max_turns: int = 16) -> tuple[list[Relabelled], str]:
    """The training transcripts one rollout gives, and a word on why it gives none: "on path"
    (the model made the expert's moves throughout), "too late" (it left the path on its last
    turn), "unsolved" (no takeover point leads the expert to a solved task, e.g. after a wrong
    write), "replay" (results did not replay)."""
    where = takeovers(rollout.family, rollout.seed, rollout.messages)
    diverged = where.diverged
    if diverged is None:
        return [], "on path"
    points = [p for p in where.points(rng) if p < max_turns]
    if not points:
        return [], "too late"
    out, why = [], "unsolved"
    for turn in points:
        try:
            messages, solved = expert_takeover(rollout.family, rollout.seed, rollout.messages, turn, max_turns)
        except ReplayMismatch:
            why = "replay"
            continue
        except ReplayError:  # e.g. the model's final answer at that turn
            continue
        if solved:
            out.append(Relabelled(rollout.family, rollout.seed, turn, messages, frozenset(range(diverged, turn))))
    return out, "" if out else why
