"""What a chat request asked of its answer, read from the body itself: tool_choice,
parallel_tool_calls, thinking and its reasoning_effort, stop sequences, and whether it continues
an assistant message it prefilled. The checkers judge an
answer against these (checks/request_compliance.py), turns.jsonl keeps them in each request's summary,
and the report splits every code by them (`variant`), whoever wrote the body: our sessions (with
--request-mix, request_mix.py), a proxied agent, a replayed capture.

Reading never raises: a body of any shape gives terms, an odd field reads as not set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The report's dimensions, in the order it lists them; request_mix.py draws the same ones.
DIMENSIONS = ("tool_choice", "parallel_tool_calls", "thinking", "stop")
NAMED = "named"  # the variant label of a tool_choice that names a function


@dataclass(frozen=True)
class RequestTerms:
    """`tool_choice`: "auto", "none", "required", or "named" with `named_tool` set. `thinking`:
    None where the body does not say (a server default applies). `stop`: the stop strings.
    `continues_assistant`: the body ends with an assistant message for the model to continue
    (its last message has role "assistant", as DeepSeek's `prefix: true` and vLLM's
    `continue_final_message: true` have it, or it sets `continue_final_message`)."""

    tool_choice: str = "auto"
    named_tool: str | None = None
    parallel_tool_calls: bool | None = None
    thinking: bool | None = None
    reasoning_effort: str | None = None
    stop: tuple[str, ...] = ()
    continues_assistant: bool = False

    @classmethod
    def of_body(cls, body: Any) -> RequestTerms:
        if not isinstance(body, dict):
            return cls()
        choice, named = body.get("tool_choice"), None
        if isinstance(choice, dict):
            fn = choice.get("function")
            named = fn.get("name") if isinstance(fn, dict) and isinstance(fn.get("name"), str) else None
            choice = NAMED if named is not None else "auto"
        elif choice not in ("none", "required"):
            choice = "auto"
        parallel = body.get("parallel_tool_calls")
        effort = body.get("reasoning_effort")
        effort = effort if isinstance(effort, str) else None
        stop = body.get("stop")
        stops = (
            (stop,)
            if isinstance(stop, str)
            else tuple(s for s in stop if isinstance(s, str))
            if isinstance(stop, list)
            else ()
        )
        return cls(
            tool_choice=choice,
            named_tool=named,
            parallel_tool_calls=parallel if isinstance(parallel, bool) else None,
            thinking=_thinking(body, effort),
            reasoning_effort=effort,
            stop=tuple(s for s in stops if s),
            continues_assistant=_continues_assistant(body),
        )

    def variant(self) -> dict[str, str]:
        """One label per dimension (DIMENSIONS): what the report groups turns by."""
        if self.thinking is None:
            thinking = "unset"
        elif not self.thinking:
            thinking = "off"
        else:
            thinking = self.reasoning_effort or "on"
        return {
            "tool_choice": self.tool_choice,
            "parallel_tool_calls": "unset"
            if self.parallel_tool_calls is None
            else str(self.parallel_tool_calls).lower(),
            "thinking": thinking,
            "stop": "set" if self.stop else "none",
        }

    def tool_choice_body(self) -> str | dict[str, Any]:
        """The tool_choice as a request writes it."""
        if self.tool_choice == NAMED and self.named_tool is not None:
            return {"type": "function", "function": {"name": self.named_tool}}
        return self.tool_choice

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "tool_choice": self.tool_choice,
            "named_tool": self.named_tool,
            "parallel_tool_calls": self.parallel_tool_calls,
            "thinking": self.thinking,
            "reasoning_effort": self.reasoning_effort,
            "stop": list(self.stop),
        }
        if self.continues_assistant:  # written only when set: most requests' summaries keep their shape
            d["continues_assistant"] = True
        return d

    @classmethod
    def from_json(cls, d: Any) -> RequestTerms:
        """Terms a summary kept (to_json), read as tolerantly as a body."""
        if not isinstance(d, dict):
            return cls()
        body: dict[str, Any] = {
            "parallel_tool_calls": d.get("parallel_tool_calls"),
            "stop": d.get("stop"),
            "reasoning_effort": d.get("reasoning_effort"),
            "continue_final_message": d.get("continues_assistant") is True,
        }
        if isinstance(d.get("thinking"), bool):
            body["chat_template_kwargs"] = {"thinking": d["thinking"]}
        choice = d.get("tool_choice")
        body["tool_choice"] = (
            {"type": "function", "function": {"name": d.get("named_tool")}} if choice == NAMED else choice
        )
        return cls.of_body(body)


def _continues_assistant(body: dict[str, Any]) -> bool:
    """Whether the body asks the model to continue an assistant message it prefilled."""
    if body.get("continue_final_message") is True:
        return True
    messages = body.get("messages")
    last = messages[-1] if isinstance(messages, list) and messages else None
    return isinstance(last, dict) and last.get("role") == "assistant"


def _thinking(body: dict[str, Any], effort: str | None) -> bool | None:
    """Thinking as SGLang and deepseek-recipe read it: DeepSeek's own `thinking` object, else
    `chat_template_kwargs` (`thinking` / `enable_thinking`); a `reasoning_effort` turns it on."""
    own = body.get("thinking")
    if isinstance(own, dict) and own.get("type") in ("enabled", "disabled"):
        return own["type"] == "enabled"
    kwargs = body.get("chat_template_kwargs")
    for key in ("thinking", "enable_thinking"):
        flag = kwargs.get(key) if isinstance(kwargs, dict) else None
        if isinstance(flag, bool):
            return flag or effort is not None
    return True if effort is not None else None
