"""What an agent framework does with a tool call before any tool runs.

A call to a tool the session does not offer, arguments that are not a JSON object, or
arguments that break the tool's JSON Schema never reach the world: the framework answers with
an error result instead. The harness's sessions and the expert's played sessions (training
data) both go through this gate, so the model learns from exactly the refusals it will read.
"""

from __future__ import annotations

import json
from typing import Any

from jsonschema import Draft202012Validator

from dsv4bench.checks.arguments import json_path
from .base import ToolError, World, format_tool_error


class CallGate:
    def __init__(self, schemas: dict[str, dict[str, Any]]) -> None:
        self.schemas = schemas
        self._validators = {n: Draft202012Validator(s) for n, s in schemas.items()}

    def check(self, name: str, raw_args: str) -> tuple[dict[str, Any] | None, str | None]:
        """(arguments, None) for a call the world may run, or (None, the error result to send back)."""
        if name not in self._validators:
            return None, format_tool_error(f"unknown tool {name!r}; available: {', '.join(self.schemas)}")
        try:
            args = json.loads(raw_args) if raw_args.strip() else {}
        except ValueError as e:
            return None, format_tool_error(f"arguments are not valid JSON ({e})")
        if not isinstance(args, dict):
            return None, format_tool_error("arguments must be a JSON object")
        err = next(iter(self._validators[name].iter_errors(args)), None)
        if err is not None:
            return None, format_tool_error(f"invalid arguments at {json_path(err)}: {err.message}")
        return args, None

    def run(self, world: World, name: str, raw_args: str) -> str:
        """The call's result as the session sends it back: the refusal, the tool's error, or its output."""
        args, refusal = self.check(name, raw_args)
        if args is None:
            assert refusal is not None
            return refusal
        return self.execute(world, name, args)

    @staticmethod
    def execute(world: World, name: str, args: dict[str, Any]) -> str:
        """Run a call `check` let through: the tool's output, or its error as the session sends it."""
        try:
            return world.execute(name, args)
        except ToolError as exc:
            return format_tool_error(exc)
