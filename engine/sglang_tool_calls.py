"""`engine serve --tool-call-parser sglang`: tool calls parsed by SGLang's own DeepSeek-V4
detector (`FunctionCallParser(tools, "deepseekv4")`), so the engine answers in SGLang's shape.

Streamed, a call arrives whole, name and arguments in one delta, when its closing
`</｜DSML｜invoke>` has been generated (SGLang's detector holds the markup back until then), where
deepseek-recipe streams it as it is written; prose that came in the same engine event as the
start of the markup is held back with it and arrives with the call. Not streamed, the whole
content is parsed at the end (`parse_non_stream`), as SGLang does. Reasoning, content, stop strings and usage stay
deepseek-recipe's (TextChatOutput). sglang is imported on first use only: `import sglang` brings
torch, triton and more with it, and points Triton's and Inductor's caches at ~/.cache/sglang where
they are not set.
"""

from __future__ import annotations

import functools
import uuid
from typing import Any

from .outputs import TextChatOutput
from .prepared_request import PreparedRequest
from .tokenizer import DSV4Tokenizer

DETECTOR = "deepseekv4"


@functools.cache
def _sglang() -> tuple[Any, Any] | str:
    """SGLang's FunctionCallParser and Tool classes, or the one-line reason they cannot be imported."""
    try:
        from sglang.srt.entrypoints.openai.protocol import Tool
        from sglang.srt.function_call.function_call_parser import FunctionCallParser
    except Exception as e:  # noqa: BLE001 - sglang/__init__.py imports a serving stack that may not fit this host
        return f"SGLang's parser not installed ({type(e).__name__}: {e})"
    return FunctionCallParser, Tool


def sglang_missing() -> str | None:
    """Why SGLang's tool-call parser cannot serve here, or None when it can (imports it)."""
    found = _sglang()
    return found if isinstance(found, str) else None


class SglangToolCallOutput(TextChatOutput):
    """TextChatOutput whose tool calls SGLang's DeepSeek-V4 detector parses out of the content."""

    def __init__(self, req: PreparedRequest, tokenizer: DSV4Tokenizer) -> None:
        super().__init__(req, tokenizer)
        assert req.conversation is not None
        found = _sglang()
        assert not isinstance(found, str), found  # the CLI refuses --tool-call-parser sglang without it
        parser, tool = found
        # deepseek-recipe lists no tools under tool_choice "none"; SGLang then parses nothing either.
        offered = req.conversation.conversation.tools if req.conversation.parsing_options.parse_tool_calls else []
        self.parser = parser([tool(function={"name": t.name, "parameters": t.parameters}) for t in offered], DETECTOR)

    @staticmethod
    def _delta(index: int, item: Any) -> dict[str, Any]:
        return {
            "index": index,
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",  # SGLang's id shape
            "function": {"name": item.name, "arguments": item.parameters},
        }

    def split(self, text: str, final: bool) -> tuple[str, list[dict[str, Any]]]:
        shown, items = self.parser.parse_stream_chunk(text)
        if final:
            more, last = self.parser.parse_stream_end()
            shown, items = (shown or "") + more, [*items, *last]
        return shown or "", [self._delta(item.tool_index, item) for item in items]  # streamed: the call's ordinal

    def whole(self, response: dict[str, Any]) -> dict[str, Any]:
        choice = response["choices"][0]
        message = choice["message"]
        content, items = self.parser.parse_non_stream(message.get("content") or "")
        message["content"] = content
        if items:
            message["tool_calls"] = [self._delta(i, item) for i, item in enumerate(items)]
            if choice["finish_reason"] == "stop":
                choice["finish_reason"] = "tool_calls"
        return response
