"""Shared machinery for the scenario families.

- schema helpers, so that every object schema carries `additionalProperties: false`;
- `ToolWorld`, a World that validates arguments against the tool's JSON Schema before a
  tool method runs, dispatches by name, and hashes its state canonically;
- `follow_plan`, the skeleton of every expert policy: an ordered list of stages, each
  computing its calls from the task and the observations, matched against what has
  already been done so that the policy is a pure function of (task, seen).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from .base import Observation, Step, Task, ToolAction, ToolError, ToolSpec, World, is_error

# NOTE: tool results of ours never start with "error"; an error result (base.format_tool_error)
# is how a session and `play_expert` report a ToolError back to the model.

# A replayed transcript of a misbehaving model can be long; past this many observations the
# expert stops exploring and answers with what it has.
MAX_OBSERVATIONS = 40

Schema = dict[str, Any]


def obj(properties: dict[str, Schema], required: Sequence[str] = ()) -> Schema:
    """An object schema that rejects unknown keys."""
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


def canonical_digest(state: Any) -> str:
    """sha256 of a canonical JSON dump: key order and float formatting never vary."""
    text = json.dumps(state, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


class ToolWorld(World):
    """A World whose tools are methods named `tool_<name>`, called with validated arguments.

    Subclasses set `tools` and implement `state()`; the validators are built once per
    class (at import time, so that running a tool never loads a meta-schema from disk).
    """

    tools: ClassVar[tuple[ToolSpec, ...]] = ()
    _validators: ClassVar[dict[str, Draft202012Validator]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._validators = {t.name: Draft202012Validator(t.parameters) for t in cls.tools}

    def execute(self, name: str, arguments: dict[str, Any]) -> str:
        validator = self._validators.get(name)
        if validator is None:
            known = ", ".join(sorted(self._validators))
            raise ToolError(f"unknown tool {name!r}; known tools: {known}")
        if not isinstance(arguments, dict):
            raise ToolError(f"{name}: arguments must be a JSON object")
        error = best_match(validator.iter_errors(arguments))
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "arguments"
            raise ToolError(f"{name}: invalid {where}: {error.message}")
        return getattr(self, f"tool_{name}")(**arguments)

    def state(self) -> Any:
        """Everything the tools can change or reveal, as JSON-able data."""
        raise NotImplementedError

    def digest(self) -> str:
        return canonical_digest(self.state())


# --- expert plans ---------------------------------------------------------------------

StageFn = Callable[[Task, list[Observation]], Sequence[ToolAction] | None]
FinishFn = Callable[[Task, list[Observation]], str]

# Parsing a garbled observation may fail in any of these ways; the stage is then skipped.
_PARSE_ERRORS = (ValueError, KeyError, IndexError, TypeError, AttributeError)


def call(name: str, **arguments: Any) -> ToolAction:
    """A ToolAction from keyword arguments (lists, never tuples: they must survive JSON)."""
    return ToolAction(name, arguments)


def _find_after(seen: list[Observation], calls: Sequence[ToolAction], start: int) -> tuple[int, list[ToolAction]]:
    """Where the calls were all made at or after `start`, and the calls not made yet."""
    end, missing = start, []
    for c in calls:
        hit = next((i for i in range(start, len(seen)) if seen[i].action == c), None)
        if hit is None:
            missing.append(c)
        else:
            end = max(end, hit + 1)
    return end, missing


def follow_plan(task: Task, seen: list[Observation], stages: Sequence[StageFn], finish: FinishFn) -> Step:
    """The next step of a staged plan, given everything seen so far.

    Each stage's calls are looked up in `seen` after the point where the previous stage
    was satisfied, so foreign calls in between (a model's own moves) are tolerated, and a
    call of ours that failed counts as done: the policy never loops on an error. A stage
    that returns None (nothing to do, or nothing it can parse) is skipped.
    """
    if len(seen) >= MAX_OBSERVATIONS:
        return Step(final=finish(task, seen))
    cursor = 0
    for stage in stages:
        try:
            calls = stage(task, seen)
        except _PARSE_ERRORS:
            calls = None
        if not calls:
            continue
        cursor, missing = _find_after(seen, calls, cursor)
        if missing:
            return Step(calls=tuple(missing))
    try:
        return Step(final=finish(task, seen))
    except _PARSE_ERRORS:
        return Step(final="I could not complete the task with the information gathered.")


def successes(seen: list[Observation], name: str) -> list[Observation]:
    """The observations of tool `name` that did not fail, in order."""
    return [o for o in seen if o.action.name == name and not is_error(o.result)]


def first_match(seen: list[Observation], name: str, pattern: str, flags: int = 0) -> re.Match[str] | None:
    """The first regex match of `pattern` in a successful result of tool `name`."""
    rx = re.compile(pattern, flags)
    for o in successes(seen, name):
        m = rx.search(o.result)
        if m:
            return m
    return None


def numbered(lines: Sequence[str], start: int = 1) -> str:
    """Lines with right-aligned line numbers, the way editors and agents show code."""
    width = len(str(start + len(lines) - 1))
    return "\n".join(f"{i:>{width}} | {line}" for i, line in enumerate(lines, start))


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table; floats with two decimals."""

    def cell(v: Any) -> str:
        return f"{v:.2f}" if isinstance(v, float) else str(v)

    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(out)
