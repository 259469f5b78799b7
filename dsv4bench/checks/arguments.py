"""Tool-call argument checks: is it JSON, is it an offered tool, does it fit the tool's schema.

Each call is judged by exactly one owner per fault: `unknown_tool` owns calls to a name that
was not offered, `args_not_json` owns arguments that are not a JSON object, and
`schema_violation` judges only what is left (a known tool with an object for arguments).
"""

from __future__ import annotations

import functools
import json
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from dsv4bench.checks.common import clip, decode_json, decode_object, response_of
from dsv4bench.history.records import TurnContext, Verdict

MAX_SCHEMA_ERRORS = 5  # reported per call; the rest are counted


def json_path(error: ValidationError) -> str:
    """The JSONPath of the failing instance, e.g. `$.edits[0].new`."""
    path = "$"
    for part in error.absolute_path:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


@functools.lru_cache(maxsize=256)
def _validator_for(schema_key: str) -> Draft202012Validator:
    return Draft202012Validator(json.loads(schema_key))


def validator_for(schema: dict[str, Any]) -> Draft202012Validator:
    """A cached validator for `schema`, keyed by the schema's canonical JSON."""
    return _validator_for(json.dumps(schema, sort_keys=True, separators=(",", ":")))


def _not_json_reason(raw: str) -> str | None:
    if raw == "":
        return "empty string (a call without arguments should send '{}')"
    try:
        value = decode_json(raw)
    except (ValueError, TypeError) as e:
        return f"invalid JSON ({e})"
    if not isinstance(value, dict):
        return f"JSON {type(value).__name__}, not an object"
    return None


def check_args_not_json(ctx: TurnContext) -> list[Verdict]:
    """Arguments that do not decode to a JSON object: one verdict per bad call.

    Invalid JSON, NaN / Infinity, a list, a string, a number, null and the empty string all
    count ("" is what a dropped argument stream looks like; servers send "{}" for no args).
    """
    verdicts = []
    for i, call in enumerate(response_of(ctx).tool_calls):
        reason = _not_json_reason(call.arguments)
        if reason is not None:
            detail = f"{call.name}: {reason}: {clip(call.arguments)!r}"
            verdicts.append(Verdict("args_not_json", detail, f"tool_calls[{i}].arguments"))
    return verdicts


def check_unknown_tool(ctx: TurnContext) -> list[Verdict]:
    """A call whose name is missing, empty, or not among the tools the request offered."""
    verdicts = []
    offered = sorted(ctx.tools)
    for i, call in enumerate(response_of(ctx).tool_calls):
        if not call.name:
            verdicts.append(Verdict("unknown_tool", f"call has no name ({call.name!r})", f"tool_calls[{i}].name"))
        elif call.name not in ctx.tools:
            detail = f"{clip(call.name)!r} was not offered; offered: {clip(', '.join(offered))}"
            verdicts.append(Verdict("unknown_tool", detail, f"tool_calls[{i}].name"))
    return verdicts


def check_schema_violation(ctx: TurnContext) -> list[Verdict]:
    """Arguments that violate the offered tool's JSON Schema (Draft 2020-12).

    One verdict per validation error, naming the failing JSON path and the validator's
    message; at most `MAX_SCHEMA_ERRORS` per call (sorted by path), the last one counting
    the rest. Calls to unknown tools, calls whose arguments are not an object, and tools
    offered without a schema are skipped: other checkers own the first two, and the last
    has nothing to violate.
    """
    verdicts = []
    for i, call in enumerate(response_of(ctx).tool_calls):
        schema = ctx.tools.get(call.name or "")
        args = decode_object(call.arguments)
        if not schema or args is None:
            continue
        errors = sorted(validator_for(schema).iter_errors(args), key=lambda e: (json_path(e), e.message))
        shown = errors[:MAX_SCHEMA_ERRORS]
        for n, error in enumerate(shown):
            detail = f"{call.name}: {json_path(error)}: {clip(error.message, 160)}"
            if n == len(shown) - 1 and len(errors) > len(shown):
                detail += f" (+{len(errors) - len(shown)} more errors)"
            verdicts.append(Verdict("schema_violation", detail, f"tool_calls[{i}].arguments"))
    return verdicts
