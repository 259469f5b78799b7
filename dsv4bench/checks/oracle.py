"""The --raw oracle: DeepSeek's own renderer and parser (deepseek-recipe) as a reference, and the
`parser_disagreement` code over any family's reference reading (raw_readers.py).

With `--raw` the harness also fetches the model's raw completion text (special tokens
kept). `parse_raw_completion` parses it the way DeepSeek's reference front end would, and
`check_parser_disagreement` compares that with what the server sent: a difference means the
server's own tool parser (or its streaming) changed the model's answer on the way out.

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
from typing import TYPE_CHECKING, Any

import deepseek_recipe as dr

from dsv4bench.checks.common import clip, decode_json, first_difference, response_of
from dsv4bench.history.codes import ORACLE_CODE
from dsv4bench.history.records import AssembledResponse, ToolCall, TurnContext, Verdict

if TYPE_CHECKING:
    from dsv4bench.checks.raw_readers import RawReading

_TOKENS = dr.SpecialTokens()
EOS = _TOKENS.token(dr.SpecialToken.Eos)
THINK_END = _TOKENS.token(dr.SpecialToken.ThinkingEnd)
_FINISH = {
    "stop": dr.InferenceFinishReason.Stop,
    "length": dr.InferenceFinishReason.Length,
    "content_filter": dr.InferenceFinishReason.ContentFilter,
}


# The event a run writes where the raw oracle is not offered for a family on a server (no
# renderer for its prompt): harness/server_watch.py writes it, the report reads it.
NOT_OFFERED_EVENT = "raw_not_offered"


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
STOP_TOKENS = (EOS, "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|return|>", "</s>",
               "<end_of_turn>", "<turn|>", "<|user|>", "<|observation|>")


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


def body_for(ctx: TurnContext) -> dict[str, Any]:
    """A request body with the turn's tools, tool_choice and thinking flag, enough for the
    parser (TurnContext holds no transcript). An unknown thinking flag (None, as in audits)
    is left out, so `parse_raw_completion` infers it from the raw text."""
    body: dict[str, Any] = {"model": "DeepSeek-V4-Pro", "messages": [{"role": "user", "content": "."}],
                            "tool_choice": ctx.terms.tool_choice_body()}
    if ctx.thinking is not None:
        body["chat_template_kwargs"] = {"thinking": ctx.thinking}
    if ctx.tools:
        no_args = {"type": "object", "properties": {}}
        body["tools"] = [
            {"type": "function", "function": {"name": name, "parameters": schema or no_args}}
            for name, schema in ctx.tools.items()
        ]
    return body


def raw_finish(server: AssembledResponse) -> str:
    """The backend finish reason a turn's raw completion is parsed with: `length` where the
    server's answer was cut there, else `stop` (the raw request does not say)."""
    return "length" if server.finish_reason == "length" else "stop"


def json_equal(a: Any, b: Any) -> bool:
    """Equality of decoded JSON values: numbers by value (5 == 5.0), but true is not 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def arguments_agree(oracle: str, server: str) -> bool:
    """Two calls' arguments say the same: as decoded JSON (`json_equal`), else as text, stripped."""
    try:
        return json_equal(decode_json(oracle), decode_json(server))
    except (ValueError, TypeError):
        return oracle.strip() == server.strip()


def oracle_reading(ctx: TurnContext) -> RawReading | None:
    """The turn's raw completion read by its family's reference reader (raw_readers.read_raw),
    or None without one."""
    # Imported here: raw_readers reads with this module's deepseek-recipe parse.
    from dsv4bench.checks.raw_readers import read_raw

    if ctx.raw_completion is None or ctx.response is None:
        return None
    server = ctx.response
    return read_raw(ctx.raw_completion, body_for(ctx), family=getattr(ctx, "family", None), model=server.model,
                    finish_reason=raw_finish(server), stream=server.stream)


def check_parser_disagreement(ctx: TurnContext) -> list[Verdict]:
    """The oracle's reading of `ctx.raw_completion` differs from what the server sent.

    The oracle is the turn's family's reference reader (raw_readers.py: deepseek-recipe for
    DeepSeek-V4, SGLang's detectors for the others). Compared: the sequence of tool call
    names; each call's arguments as decoded JSON (5 and 5.0 agree, key order does not matter;
    text that does not decode is compared stripped); content, stripped. One verdict per
    difference, saying what the oracle saw and what the server sent. Reasoning, ids and
    finish_reason are not compared. Returns [] when the turn has no raw completion, and when no
    reader could read it (the parser view says why: parser_view.py).
    """
    reading = oracle_reading(ctx)
    if reading is None or reading.oracle is None:
        return []
    server, oracle = response_of(ctx), reading.oracle
    verdicts = []
    o_names, s_names = [c.name for c in oracle.tool_calls], [c.name for c in server.tool_calls]
    if o_names != s_names:
        detail = f"tool call names: oracle saw {o_names}, server sent {s_names}"
        verdicts.append(Verdict(ORACLE_CODE, detail, "tool_calls"))
    for i, (o, s) in enumerate(zip(oracle.tool_calls, server.tool_calls)):
        if not arguments_agree(o.arguments, s.arguments):
            detail = f"{s.name} arguments: oracle saw {clip(o.arguments)!r}, server sent {clip(s.arguments)!r}"
            verdicts.append(Verdict(ORACLE_CODE, detail, f"tool_calls[{i}].arguments"))
    o_text, s_text = oracle.content.strip(), server.content.strip()
    if o_text != s_text:
        at = first_difference(o_text, s_text)
        k = max(0, at - 20)
        detail = f"content differs at {at}: oracle saw {clip(o_text[k:], 80)!r}, server sent {clip(s_text[k:], 80)!r}"
        verdicts.append(Verdict(ORACLE_CODE, detail, "content"))
    return verdicts
