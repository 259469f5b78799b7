"""The --raw oracle's reading of DeepSeek-V4: DeepSeek's own renderer and parser (deepseek-recipe).

How deepseek-recipe 0.2.0 behaves (found by experiment; pinned in tests/checks/test_oracle.py):

- Markup it parses: the canonical `<｜DSML｜tool_calls>` block (U+FF5C bars, upper-case
  `DSML`), also with spaces inside tags (`<｜DSML｜ tool_calls>`, `< ｜DSML｜invoke`,
  `tool _calls`) and with V3.2's `function_calls` block name. A bare `<｜DSML｜invoke ...>`
  with no block opener is parsed as a call too.
- Markup it does not parse, leaving it verbatim in content with finish_reason "stop":
  ASCII `|` or any other bar, doubled bars, lower-case `dsml`, bare `<invoke name=...>`,
  V3's `<｜tool▁calls▁begin｜>` tokens. So the oracle is blind to these variants; the
  regex detector in dsml.py is not.
- Malformed DSML: an unterminated block (no closing tag) still yields its calls and
  finish_reason "tool_calls"; an unterminated parameter yields cut JSON
  (`{"path": "main.py`); a `string="false"` value is pasted verbatim, so `5x` gives
  `{"n": 5x}`; a parameter without the `string` attribute yields garbage arguments
  (`{"path">main.py</｜DSML｜parameter>...`); unknown tool names pass through.
- Any `<｜DSML｜` switches it into tool-call mode: a stray `<｜DSML｜` in prose silently
  swallows the rest of the text (content is cut there, no call, finish_reason "stop");
  a stray `<｜DSML｜` just before a real block is dropped and the block parsed.
- Only the first block counts: text after `</｜DSML｜tool_calls>` and any second block are
  dropped. A block written inside the reasoning (before `</think>`) ends the reasoning and
  is parsed as a call.
- finish Length in the middle of a block gives a call with arguments "" and finish_reason
  "length".
- `<｜end▁of▁sentence｜>` after a block is dropped but after prose is kept as content text,
  so `parse_raw_completion` strips a trailing one first.
- Without `tools` in the request, or with tool_choice "none", DSML is not parsed at all.
  tool_choice "required" is refused in thinking mode; outside it the prompt ends with an
  opened `<｜DSML｜tool_calls>` and the parser starts inside the block.
- Conversion rejects model names other than `DeepSeek-V4-Pro` / `DeepSeek-V4.1-Flash`
  (ConversionError 400), hence `with_model_alias`. A request without `reasoning_effort`
  renders the maximum-effort preamble in thinking mode.
- Output chunks are single-use: `to_json()` and `ChatCompletionResponse.accumulate()` each
  consume a chunk. The parse does not depend on how the text is split into chunks.
"""

from __future__ import annotations

import json
from typing import Any

import deepseek_recipe as dr

from dsv4bench.history.records import AssembledResponse, ToolCall

_TOKENS = dr.SpecialTokens()
EOS = _TOKENS.token(dr.SpecialToken.Eos)
THINK_END = _TOKENS.token(dr.SpecialToken.ThinkingEnd)
_FINISH = {
    "stop": dr.InferenceFinishReason.Stop,
    "length": dr.InferenceFinishReason.Length,
    "content_filter": dr.InferenceFinishReason.ContentFilter,
}


def thinking_of(body: dict[str, Any]) -> bool | None:
    """The thinking flag SGLang reads from `chat_template_kwargs` (deepseek-recipe ignores it), or None."""
    kwargs = body.get("chat_template_kwargs") or {}
    for key in ("thinking", "enable_thinking"):
        if isinstance(kwargs.get(key), bool):
            return bool(kwargs[key])
    return None


def _convert(body: dict[str, Any], default_thinking: bool) -> dr.ConversationRequest:
    model = str(body.get("model") or "DeepSeek-V4-Pro")
    options = dr.ConversionOptions(default_thinking_mode=default_thinking).with_model_alias(
        model, dr.ModelVersion.DeepseekV4Pro
    )
    return dr.ChatCompletionRequest(dict(body, model=model)).convert(options)


def render_prompt(body: dict[str, Any], *, default_thinking: bool = True) -> str:
    """The DSV4 prompt text for an OpenAI chat request body, as DeepSeek's renderer writes it.

    Thinking mode: the body's own `thinking` field if any (deepseek-recipe's dialect), else
    SGLang's `chat_template_kwargs.thinking`, else `default_thinking`.
    """
    flag = thinking_of(body)
    conv = _convert(body, default_thinking if flag is None else flag)
    return dr.DeepseekV4Encoding().render_conversation(conv.conversation).prompt


def thinking_for(raw_text: str, body: dict[str, Any], default_thinking: bool | None = None) -> bool:
    """The thinking mode a raw completion was written in: the body's `thinking` field, else
    `chat_template_kwargs.thinking`, else `default_thinking`; left None, it is inferred from the
    text, since a thinking-mode completion always contains `</think>` (which needs the raw
    completion fetched with special tokens kept)."""
    flag = thinking_of(body)
    if flag is not None:
        return flag
    return THINK_END in raw_text if default_thinking is None else default_thinking


# Each family's end of turn, which a raw completion fetched with special tokens kept may end
# with: DeepSeek's EOS, ChatML's (Qwen, Kimi), Llama 3's, harmony's final `<|return|>`,
# Mistral's `</s>`, Gemma's, and GLM's (it stops on the next role's token).
STOP_TOKENS = (
    EOS,
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|return|>",
    "</s>",
    "<end_of_turn>",
    "<turn|>",
    "<|user|>",
    "<|observation|>",
)


def completion_text(raw_text: str) -> str:
    """The raw completion as the model's answer: a trailing stop token (`<｜end▁of▁sentence｜>`,
    `<|im_end|>`, ...: STOP_TOKENS, with the whitespace after it) dropped, as a server drops it."""
    text = raw_text.rstrip()
    stop = next((t for t in STOP_TOKENS if text.endswith(t)), None)
    return text.removesuffix(stop) if stop else raw_text


def parse_raw_completion(
    raw_text: str,
    body: dict[str, Any],
    *,
    default_thinking: bool | None = None,
    finish_reason: str = "stop",
) -> AssembledResponse:
    """Parse a raw completion with deepseek-recipe's stream processor into an AssembledResponse.

    `body` is the request the completion answers (its tools, tool_choice and thinking
    settings decide how the text is parsed; thinking mode as `thinking_for` finds it).
    `finish_reason` is the backend's (stop / length / content_filter).
    """
    conv = _convert(body, thinking_for(raw_text, body, default_thinking))
    model = str(body.get("model") or "")
    generator = dr.ChatCompletionRequest.chunk_generator(conv, "oracle", model)
    processor = dr.StreamProcessor(generator, conv.parsing_options)
    chunks = processor.push(dr.InferenceChunk.ready())
    chunks += processor.push(dr.InferenceChunk.text(completion_text(raw_text), 1))
    chunks += processor.push(dr.InferenceChunk.finish(_FINISH.get(finish_reason, dr.InferenceFinishReason.Stop)))
    chunks += processor.finish()
    accumulated = dr.ChatCompletionResponse("oracle", model, 0, 0, 0)
    for chunk in chunks:
        # A chat request's processor yields chat chunks only; its stub lists every API's kind.
        assert isinstance(chunk, dr.ChatCompletionChunk)
        accumulated.accumulate(chunk)
    choice = json.loads(accumulated.to_json())["choices"][0]
    message = choice.get("message") or {}
    calls = [
        ToolCall(index=i, id=c.get("id"), name=fn.get("name"), arguments=fn.get("arguments") or "")
        for i, c in enumerate(message.get("tool_calls") or [])
        for fn in [c.get("function") or {}]
    ]
    return AssembledResponse(
        model=model,
        content=message.get("content") or "",
        reasoning=message.get("reasoning_content") or "",
        tool_calls=calls,
        finish_reason=choice.get("finish_reason"),
        stream=False,
        saw_done=True,
        chunks=len(chunks),
    )
