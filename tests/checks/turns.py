"""Literal turns for the checker tests: tools with real schemas and a `turn()` builder.

Like Jepsen's literal histories: every fixture is a hand-written TurnContext.
"""

from __future__ import annotations

import json
from typing import Any

from dsv4bench.history.records import AssembledResponse, GivenText, ToolCall, TurnContext, TurnStatus

TOOLS: dict[str, dict[str, Any]] = {
    "read_file": {
        "type": "object",
        "properties": {"path": {"type": "string"}, "max_lines": {"type": "integer", "minimum": 1}},
        "required": ["path"],
        "additionalProperties": False,
    },
    "edit_file": {
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "edits": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "properties": {"old": {"type": "string"}, "new": {"type": "string"}},
                    "required": ["old", "new"],
                    "additionalProperties": False,
                },
            },
        },
        "required": ["path", "edits"],
        "additionalProperties": False,
    },
    "run_shell": {
        "type": "object",
        "properties": {
            "command": {"type": "string"},
            "timeout_s": {"type": "number", "exclusiveMinimum": 0},
            "background": {"type": "boolean"},
        },
        "required": ["command"],
    },
    "set_log_level": {
        "type": "object",
        "properties": {"service": {"type": "string"}, "level": {"enum": ["debug", "info", "warn", "error"]}},
        "required": ["service", "level"],
    },
    "list_services": {"type": "object", "properties": {}},
}

# The canonical DSV4 tool-call block (U+FF5C bars), as the model writes it.
BLOCK = (
    "<｜DSML｜tool_calls>\n"
    '<｜DSML｜invoke name="read_file">\n'
    '<｜DSML｜parameter name="path" string="true">src/main.py</｜DSML｜parameter>\n'
    "</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>"
)

Call = tuple[str | None, Any]  # (name, arguments: a str is sent as is, anything else as JSON)


def tool_calls(calls: list[Call] | list[ToolCall]) -> list[ToolCall]:
    """ToolCalls from (name, arguments) pairs; ids are call_0, call_1, ..."""
    out = []
    for i, c in enumerate(calls):
        if isinstance(c, ToolCall):
            out.append(c)
            continue
        name, args = c
        out.append(
            ToolCall(index=i, id=f"call_{i}", name=name, arguments=args if isinstance(args, str) else json.dumps(args))
        )
    return out


def turn(
    content: str = "",
    *,
    calls: list[Call] | list[ToolCall] = (),  # type: ignore[assignment]  # an empty default never mutated
    reasoning: str = "",
    finish: str | None = "auto",
    tools: dict[str, dict[str, Any]] | None = None,
    status: TurnStatus = TurnStatus.OK,
    raw: str | None = None,
    given: str | None = "",
    family: str | None = None,
    **response: Any,
) -> TurnContext:
    """An OK turn (by default) with a streamed, well-formed response.

    `finish="auto"` picks what a correct server sends: "tool_calls" with calls, else "stop".
    `given`: the text the request gave the model (its user and tool messages); "" a request
    that holds no markup, None a request not known (an audit of answers alone). `family`: the
    server's model family, None for unknown (every family checked).
    """
    made = tool_calls(list(calls))
    if finish == "auto":
        finish = "tool_calls" if made else "stop"
    fields: dict[str, Any] = {"response_id": "chatcmpl-1", "model": "DeepSeek-V4-Pro", "saw_done": True, "chunks": 10}
    fields.update(response)
    resp = AssembledResponse(content=content, reasoning=reasoning, tool_calls=made, finish_reason=finish, **fields)
    return TurnContext(
        response=resp,
        tools=TOOLS if tools is None else tools,
        status=status,
        raw_completion=raw,
        given=None if given is None else GivenText((given,)),
        family=family,
    )


def failed(
    status: TurnStatus, kind: str | None, http_status: int | None = None, error: str | None = None
) -> TurnContext:
    """A turn that did not complete: no response, only the error fields."""
    return TurnContext(response=None, tools=TOOLS, status=status, http_status=http_status, error=error, error_kind=kind)
