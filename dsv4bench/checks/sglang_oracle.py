"""SGLang's own DeepSeek-V4 parsers as the --raw oracle's second reading.

SGLang serves DeepSeek-V4 in one of two ways: with `--tool-call-parser deepseekv4
--reasoning-parser deepseek-v4` its own detectors parse the model's text (the path read here);
with the `dsv4` chat encoding spec deepseek-recipe does (the first oracle, oracle.py).
`read_with_sglang` runs the detectors as SGLang's chat server does (serving_chat.py): the
reasoning parser first, forced into reasoning in thinking mode (the DSV4 prompt opens
`<think>` itself), then its normal text through the tool-call parser, unless the request offered
no tools or said tool_choice "none". Twice: whole (`parse_non_stream`, a non-streamed answer)
and streamed (`parse_stream_chunk` per piece, `parse_stream_end` at the finish), since SGLang
answers the two through different code. SGLang's defaults apply, as this process's environment
sets them (`SGLANG_FORWARD_UNKNOWN_TOOLS`, say).

How sglang 0.5.23 reads DSV4 output next to deepseek-recipe 0.2.0 (found by experiment; pinned
in tests/checks/test_sglang_oracle.py):

- They agree on the canonical block, several calls in one block, `string="false"` JSON values,
  prose before a call (both drop prose after the block), a bare `<｜DSML｜invoke` without the
  block, zero-argument calls (`<｜DSML｜invoke name="x"/>` too), special tokens inside a string
  value, and on markup neither knows (ASCII bars, lower-case `dsml`), which both leave in the
  content.
- String values: SGLang strips the whitespace around a `string="true"` value, deepseek-recipe
  keeps it.
- Values that are not JSON: for `string="false"` SGLang falls back to the text as a string
  (`5x` -> `"5x"`, `NaN` -> `"NaN"`); deepseek-recipe pastes it verbatim (`{"n": 5x}`, and
  `NaN`, which is not JSON). So a plain-text value written `string="false"` (`src/main.py`) is
  a string to SGLang and broken JSON to deepseek-recipe.
- Malformed DSML: a parameter without `string=`, an invoke or parameter cut off (the completion
  ended there), a JSON invoke body that is not an object, a closing parameter tag written inside
  a string value: SGLang drops the call, logging why (silently for one cut off);
  deepseek-recipe emits it, with broken, cut or empty arguments, or (the closing tag) the value
  cut there. A JSON object written as the invoke body (`<｜DSML｜invoke name="x">{"path": "a"}`)
  is a call with those arguments to SGLang and a call with `{}` to deepseek-recipe.
- deepseek-recipe reads the first block only; SGLang reads every block of the text.
- A block written inside the reasoning (before `</think>`) ends the reasoning and is a call to
  deepseek-recipe; SGLang leaves it, markup and all, in the reasoning.
- A `<think>` the model writes at the start is dropped by SGLang, kept by deepseek-recipe.
- SGLang's own two paths differ: whole, it drops a call to a tool the request did not offer and
  an invoke whose block never closes, keeps a stray `<｜DSML｜` and the prose after it, and
  parses a spaced (`<｜DSML｜ tool_calls>`) or V3.2 (`function_calls`) block opener away;
  streamed, it passes the unknown call and the unclosed block's call on, cuts the prose at the
  stray marker (as deepseek-recipe does), and sends those two openers out as content.
- The streamed reading does not depend on how the text is split into pieces.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
from collections.abc import Iterator
from typing import Any, NamedTuple

from dsv4bench.checks.recipe_reader import completion_text, thinking_for, thinking_of
from dsv4bench.history.records import AssembledResponse, SglangReading, ToolCall

TOOL_CALL_PARSER, REASONING_PARSER = "deepseekv4", "deepseek-v4"
# The streamed reading's pieces: a special token whole (`<|im_end|>`, `<｜tool▁sep｜>`, gemma's
# `<|tool_call>` and `<|"|>`, `[TOOL_CALLS]`, `<tool_call>`: one token each to a tokenizer, and
# some detectors look for them only whole), else words, runs of whitespace and single marks, so
# a DSML tag reaches the parser cut up the way a model's tokens cut it.
_PIECES = re.compile(
    r"<[|｜][^<>|｜\s]{1,40}[|｜]>|<\|[\w\"]{1,20}>|<[\w\"]{1,20}\|>|\[/?[A-Z_]{2,20}\]"
    r"|</?[a-z_]{2,20}>|\s+|\w+|[^\w\s]"
)


class _Sglang(NamedTuple):
    tool_parser: Any  # FunctionCallParser
    reasoning_parser: Any  # ReasoningParser
    tool: Any  # the request's Tool model
    version: str


@functools.cache
def _sglang() -> _Sglang | str:
    """SGLang's parser classes, imported once, or the one-line reason they cannot be."""
    try:
        import sglang
        from sglang.srt.entrypoints.openai.protocol import Tool
        from sglang.srt.function_call.function_call_parser import FunctionCallParser
        from sglang.srt.parser.reasoning_parser import ReasoningParser
    except Exception as e:  # noqa: BLE001 - sglang/__init__.py imports a serving stack that may not fit this host
        return f"SGLang's parser not installed ({type(e).__name__}: {e})"
    return _Sglang(FunctionCallParser, ReasoningParser, Tool, f"sglang {sglang.__version__}")


def sglang_missing() -> str | None:
    """Why SGLang's parsers cannot read here, or None when they can (imports them)."""
    found = _sglang()
    return found if isinstance(found, str) else None


def sglang_state() -> str:
    """One line: the SGLang version whose parsers read raw completions, or why none does."""
    found = _sglang()
    return found if isinstance(found, str) else found.version


class _Log(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextlib.contextmanager
def _sglang_log() -> Iterator[list[str]]:
    """What SGLang's loggers say meanwhile, kept as evidence instead of going to stderr."""
    logger, handler = logging.getLogger("sglang"), _Log()
    propagate, logger.propagate = logger.propagate, False
    logger.addHandler(handler)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def _response(
    content: str, reasoning: str, calls: list[tuple[str, str]], finish_reason: str, stream: bool
) -> AssembledResponse:
    """A reading as SGLang would answer it: finish `tool_calls` once a call was parsed."""
    return AssembledResponse(
        content=content,
        reasoning=reasoning,
        stream=stream,
        saw_done=True,
        tool_calls=[ToolCall(index=i, id=None, name=name, arguments=args) for i, (name, args) in enumerate(calls)],
        finish_reason="tool_calls" if calls and finish_reason == "stop" else finish_reason,
    )


class _Plain:
    """A family with no reasoning parser: all of the text is the answer."""

    def parse_non_stream(self, text: str) -> tuple[str, str]:
        return "", text

    def parse_stream_chunk(self, text: str) -> tuple[str, str]:
        return "", text

    def parse_stream_end(self) -> tuple[str, str]:
        return "", ""


def _reasoner(sg: _Sglang, parser: str | None, stream: bool, thinking: bool) -> Any:
    return (
        _Plain() if parser is None else sg.reasoning_parser(parser, stream_reasoning=stream, force_reasoning=thinking)
    )


def _whole(
    sg: _Sglang, text: str, tools: list[Any], parsers: tuple[str, str | None], thinking: bool, finish_reason: str
) -> AssembledResponse:
    reasoning, normal = _reasoner(sg, parsers[1], False, thinking).parse_non_stream(text)
    content, items = sg.tool_parser(tools, parsers[0]).parse_non_stream(normal or "")
    return _response(content, reasoning or "", [(c.name, c.parameters) for c in items], finish_reason, False)


def _streamed(
    sg: _Sglang, text: str, tools: list[Any], parsers: tuple[str, str | None], thinking: bool, finish_reason: str
) -> AssembledResponse:
    reasoning_parser = _reasoner(sg, parsers[1], True, thinking)
    tool_parser = sg.tool_parser(tools, parsers[0])
    reasoning: list[str] = []
    content: list[str] = []
    calls: dict[int, list[str]] = {}  # tool_index -> [name, arguments so far]

    def take(normal: str | None, ends: bool) -> None:
        shown, items = tool_parser.parse_stream_chunk(normal or "")
        if ends:
            more, last = tool_parser.parse_stream_end()
            shown, items = (shown or "") + more, [*items, *last]
        content.append(shown or "")
        for item in items:
            call = calls.setdefault(item.tool_index, ["", ""])
            call[0] = call[0] or item.name or ""
            call[1] += item.parameters or ""

    for piece in _PIECES.findall(text):
        thought, normal = reasoning_parser.parse_stream_chunk(piece)
        reasoning.append(thought or "")
        take(normal, False)
    thought, normal = reasoning_parser.parse_stream_end()
    reasoning.append(thought or "")
    take(normal, True)
    return _response("".join(content), "".join(reasoning), [(n, a) for n, a in calls.values()], finish_reason, True)


def _thinking(
    sg: _Sglang, parser: str | None, raw_text: str, body: dict[str, Any], default_thinking: bool | None
) -> bool:
    """thinking_for, with the family's own end-of-thinking marker (`[/THINK]`, harmony's `<|end|>`)."""
    if parser is None:
        return False
    if thinking_of(body) is not None or default_thinking is not None:
        return thinking_for(raw_text, body, default_thinking)
    return str(sg.reasoning_parser(parser).detector.think_end_token) in raw_text


def read_with_sglang(
    raw_text: str,
    body: dict[str, Any],
    *,
    default_thinking: bool | None = None,
    finish_reason: str = "stop",
    tool_parser: str = TOOL_CALL_PARSER,
    reasoning_parser: str | None = REASONING_PARSER,
) -> SglangReading:
    """SGLang's readings of a raw completion, streamed and whole; never raises.

    `body`, `default_thinking` and `finish_reason` as for recipe_reader.parse_raw_completion;
    `tool_parser` and `reasoning_parser`: SGLang's names of the family's detectors (no reasoning
    parser: the whole text is the answer). Without SGLang, or where its parser raises, the
    reading has no responses and its state says why.
    """
    sg = _sglang()
    if isinstance(sg, str):
        return SglangReading(sg)
    text = completion_text(raw_text)
    with _sglang_log() as log:
        try:
            thinking = _thinking(sg, reasoning_parser, raw_text, body, default_thinking)
            offered = [] if body.get("tool_choice") == "none" else body.get("tools") or []
            tools = [sg.tool.model_validate(t) for t in offered]
            parsers = (tool_parser, reasoning_parser)
            whole = _whole(sg, text, tools, parsers, thinking, finish_reason)
            stream = _streamed(sg, text, tools, parsers, thinking, finish_reason)
        except Exception as e:  # noqa: BLE001 - a parser that breaks is a finding, not a crash
            return SglangReading(f"{sg.version}: its parser raised {type(e).__name__}: {e}", log=log)
    return SglangReading(sg.version, stream, whole, list(dict.fromkeys(log)))  # each line once, for both paths
