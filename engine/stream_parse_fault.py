"""The `parser-split` fault: a streaming tool-call parse that passes content on eagerly.

The clean server lets deepseek-recipe parse DSML out of the token stream; its parser holds back
text that may be the start of a tag until the tag is complete. Under `parser-split` the server
runs SGLang's shape instead: each engine event (one step's tokens of this request) is
detokenized into one chunk of text, deepseek-recipe with tool parsing off does reasoning,
content, stop strings and usage, and `EagerDsmlParser` splits each chunk of content text into
text and tool calls. It recognises the block opener `<｜DSML｜tool_calls>` in the accumulated
text, but until the opener is complete it passes every chunk on as content, with no hold-back
of a possible partial tag: the bug class of streaming tool parsers that check "is the start tag
in the text yet?" and otherwise return the delta as content.

So the opener is handled cleanly only when it arrives whole within one chunk of text. Split
across chunks, its leading pieces (`<`, `｜DSML｜`, `tool`, `_`, `calls`) have already gone out
as content when the closing `>` completes it; the calls inside the block still parse, from the
accumulated block text. In DSV4-mini every opener is six tokens and the engine streams one token
per step to each request, so every tool-call turn leaks the opener's first five tokens, at any
concurrency. Nothing here writes markup: the leak is the model's own text, misrouted.

Only streamed chat goes this way; a non-streamed response is parsed whole by deepseek-recipe.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

from .outputs import TextChatOutput
from .prepared_request import PreparedRequest
from .tokenizer import DSV4Tokenizer

BLOCK_OPEN = "<｜DSML｜tool_calls>"
BLOCK_CLOSE = "</｜DSML｜tool_calls>"
_INVOKE = re.compile(r'<｜DSML｜invoke name="([^"]*)">(.*?)</｜DSML｜invoke>', re.DOTALL)
_PARAMETER = re.compile(r'<｜DSML｜parameter name="([^"]*)" string="(true|false)">(.*?)</｜DSML｜parameter>', re.DOTALL)


def arguments_json(body: str) -> str:
    """The JSON arguments of one invoke body: `string="true"` values as JSON strings, the others
    as the raw JSON text the model wrote (invalid JSON stays invalid, as with deepseek-recipe)."""
    items = [
        f"{json.dumps(name, ensure_ascii=False)}: "
        f"{json.dumps(value, ensure_ascii=False) if is_string == 'true' else value}"
        for name, is_string, value in _PARAMETER.findall(body)
    ]
    return "{" + ", ".join(items) + "}"


class EagerDsmlParser:
    """Chunks of content text in; per chunk, the text to show and the tool calls completed.

    `feed(chunk) -> (text, calls)`, each call an OpenAI stream tool-call delta carrying its
    index, id, name and whole arguments. Mutates its own state only.
    """

    def __init__(self, starts_in_block: bool = False) -> None:
        self.outside = ""  # content text since the last block (where the opener is looked for)
        self.block: str | None = "" if starts_in_block else None  # unparsed text inside a block
        self.num_calls = 0

    def feed(self, chunk: str) -> tuple[str, list[dict[str, Any]]]:
        if self.block is not None:
            self.block += chunk
            return self._parse_block()
        searched = max(0, len(self.outside) - len(BLOCK_OPEN) + 1)
        self.outside += chunk
        at = self.outside.find(BLOCK_OPEN, searched)
        if at < 0:
            return chunk, []  # NOTE: the fault. A chunk ending in a partial opener goes out as content.
        # The opener is complete. Its pieces that came in earlier chunks are already content.
        text = chunk[: max(0, at - (len(self.outside) - len(chunk)))]
        self.block, self.outside = self.outside[at + len(BLOCK_OPEN) :], ""
        more, calls = self._parse_block()
        return text + more, calls

    def _parse_block(self) -> tuple[str, list[dict[str, Any]]]:
        assert self.block is not None
        calls = []
        while (m := _INVOKE.search(self.block)) and m.start() < self._close_at():
            calls.append(self._call(m.group(1), m.group(2)))
            self.block = self.block[m.end() :]
        close = self._close_at()
        if close == len(self.block):
            return "", calls
        rest, self.block = self.block[close + len(BLOCK_CLOSE) :], None
        text, more = self.feed(rest)
        return text, calls + more

    def _close_at(self) -> int:
        assert self.block is not None
        at = self.block.find(BLOCK_CLOSE)
        return len(self.block) if at < 0 else at

    def _call(self, name: str, body: str) -> dict[str, Any]:
        index, self.num_calls = self.num_calls, self.num_calls + 1
        return {
            "index": index,
            "id": f"call_{index:02d}_{secrets.token_hex(12)}",
            "type": "function",
            "function": {"name": name, "arguments": arguments_json(body)},
        }


class EagerParseChatOutput(TextChatOutput):
    """TextChatOutput for a streamed chat under `parser-split`: `EagerDsmlParser` on the content."""

    def __init__(self, req: PreparedRequest, tokenizer: DSV4Tokenizer) -> None:
        super().__init__(req, tokenizer)
        assert req.conversation is not None
        self.parser = EagerDsmlParser(starts_in_block=req.conversation.parsing_options.starts_in_tool_calls)

    def split(self, text: str, final: bool) -> tuple[str, list[dict[str, Any]]]:
        return self.parser.feed(text)  # NOTE: no hold-back, so nothing to let go at the end
