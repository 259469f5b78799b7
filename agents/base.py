"""The contract every scenario family implements.

A family is data plus pure functions: tools declared as JSON Schemas, a virtual world
built from a seed that the tools read and change (never the host: no files, processes or
network), a seeded task generator, and a scripted expert policy that says which tool calls
a competent agent makes next given what it has seen so far.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, TypeVar


class ToolError(Exception):
    """A tool refused its arguments. The session turns it into an error tool result."""


# The tool-result convention shared by the harness's sessions and the expert policies.
ERROR_PREFIX = "error: "


def format_tool_error(reason: object) -> str:
    """The text a session sends back as the tool result when a call could not run."""
    return f"{ERROR_PREFIX}{reason}"


def is_error(result: str) -> bool:
    """Whether a tool result reports an error rather than data."""
    head = result.lstrip()[:16].lower()
    return head.startswith(("error:", "error -", '{"error"'))


@dataclass(frozen=True)
class ToolSpec:
    """One tool: its name, what it does, and its arguments as a Draft 2020-12 JSON Schema."""

    name: str
    description: str
    parameters: dict[str, Any]

    def openai(self) -> dict[str, Any]:
        """The tool as an OpenAI `tools` entry."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclass(frozen=True)
class ToolAction:
    """A tool call the expert (or the model) makes: a name and decoded arguments."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Step:
    """The expert's next move: tool calls to make, or (when `calls` is empty) a final answer."""

    calls: tuple[ToolAction, ...] = ()
    final: str | None = None

    def __post_init__(self) -> None:
        assert bool(self.calls) != (self.final is not None), "a step makes calls or gives a final answer"

    @property
    def is_final(self) -> bool:
        return not self.calls


@dataclass(frozen=True)
class Observation:
    """A tool call made earlier in the session and the text it returned."""

    action: ToolAction
    result: str


@dataclass(frozen=True)
class Task:
    """A task for one session. `goal` is private to the expert policy and the evaluation."""

    family: str
    seed: int
    prompt: str
    goal: dict[str, Any] = field(default_factory=dict)


T = TypeVar("T")

# A build made in steps: each next() runs one step, and the last ends in StopIteration with what
# was built. The same draws in the same order whether its caller pauses between steps or not.
Steps = Generator[None, None, T]


def run_steps(steps: Steps[T]) -> T:
    """What `steps` builds, every step run at once: what every caller but the driver wants."""
    while True:
        try:
            next(steps)
        except StopIteration as built:
            return built.value


class World(abc.ABC):
    """The in-memory state a family's tools act on. Deterministic for a given seed."""

    @abc.abstractmethod
    def execute(self, name: str, arguments: dict[str, Any]) -> str:
        """Run tool `name` on this world and return its text result.

        Raises ToolError for arguments the tool cannot use (missing file, bad table...);
        an unknown name raises ToolError too. Mutating tools change this world.
        """

    @abc.abstractmethod
    def digest(self) -> str:
        """A stable hash of the world's state, to compare a session's end state with the expert's."""


class ScenarioFamily(abc.ABC):
    """One kind of agent work (coding, data/SQL, ops...). Stateless: all state is in World."""

    name: str
    description: str
    system_prompt: str
    tools: tuple[ToolSpec, ...]

    @abc.abstractmethod
    def build_world(self, seed: int) -> World:
        """A fresh world for `seed`; the same seed always gives the same world."""

    def build_world_steps(self, seed: int) -> Steps[World]:
        """`build_world(seed)`'s world, built in steps (see `Steps`): the driver runs each step in a
        pass of the loop of its own, so that a world that costs milliseconds holds no pass for them
        all. A world cheap enough to build at once keeps this default: one step."""
        yield from ()  # a generator that never pauses
        return self.build_world(seed)

    @abc.abstractmethod
    def make_task(self, world: World, seed: int) -> Task:
        """A natural-language task on `world`; varied across seeds, fixed for one seed."""

    @abc.abstractmethod
    def solved(self, task: Task, world: World) -> bool:
        """Whether `world` is in a state that solves `task` (looser than equal digests)."""

    @abc.abstractmethod
    def expert_step(self, task: Task, seen: list[Observation]) -> Step:
        """The next move of a competent agent that has seen `seen` so far.

        Arguments come from the task prompt or from earlier results, never from the
        world directly: a model trained on these transcripts must copy, not recall.
        """

    def tool_schemas(self) -> dict[str, dict[str, Any]]:
        return {t.name: t.parameters for t in self.tools}

    def openai_tools(self) -> list[dict[str, Any]]:
        return [t.openai() for t in self.tools]


def observations_from_messages(messages: list[dict[str, Any]]) -> list[Observation]:
    """Recover the (tool call, result) pairs of an OpenAI chat transcript, in order.

    Calls whose arguments do not decode to an object, or that have no result, are skipped:
    the expert only learns from what a competent agent could have seen.
    """
    results = {m.get("tool_call_id"): _text(m.get("content")) for m in messages if m.get("role") == "tool"}
    seen: list[Observation] = []
    for m in messages:
        if m.get("role") != "assistant":
            continue
        for tc in m.get("tool_calls") or []:
            fn = tc.get("function") or {}
            try:
                args = json.loads(fn.get("arguments") or "")
            except (TypeError, ValueError):
                continue
            if not isinstance(args, dict) or tc.get("id") not in results:
                continue
            seen.append(Observation(ToolAction(fn.get("name") or "", args), results[tc["id"]]))
    return seen


def _text(content: Any) -> str:
    """Message content as text: OpenAI also allows a list of parts."""
    if isinstance(content, list):
        return "".join(p.get("text") or "" for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""
