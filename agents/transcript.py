"""The OpenAI chat transcript of an agent session, built one way for everyone.

The harness (dsv4bench/harness/session.py) builds what it sends to the server with these functions and
the engine's training data (`session_messages`, agents/__init__.py) builds the expert's sessions
with them, so what the model is trained on has the very shape of what the harness sends it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple


class CallText(NamedTuple):
    """One tool call as the assistant wrote it: `arguments` is its JSON text, not parsed."""

    id: str
    name: str
    arguments: str


def default_call_id(turn: int, index: int) -> str:
    """The id of a call that came without one: its turn and its place in the turn."""
    return f"call_{turn}_{index}"


def opening_messages(system_prompt: str, task_prompt: str) -> list[dict[str, Any]]:
    """A session's first two messages: the family's system prompt, the task as the user's."""
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": task_prompt}]


def assistant_message(
    content: str | None, calls: Iterable[CallText] = (), *, reasoning: str | None = None, with_reasoning: bool = False
) -> dict[str, Any]:
    """An assistant turn: its text, its reasoning when `with_reasoning`, and its tool calls if any."""
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if with_reasoning:
        msg["reasoning_content"] = reasoning
    tool_calls = [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls
    ]
    if tool_calls:
        msg["tool_calls"] = tool_calls
    return msg


def tool_message(call_id: str, result: str) -> dict[str, Any]:
    """The result of the call `call_id`, as the tool's message."""
    return {"role": "tool", "tool_call_id": call_id, "content": result}


def transcript_chars(messages: list[dict[str, Any]]) -> int:
    """Characters of text a model reads in a transcript: contents plus call names and arguments."""
    total = 0
    for m in messages:
        total += len(m.get("content") or "")
        for tc in m.get("tool_calls") or []:
            total += len(tc["function"]["name"]) + len(tc["function"]["arguments"])
    return total
