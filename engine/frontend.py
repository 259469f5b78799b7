"""Front end: OpenAI request bodies in, engine requests out; engine token events in, OpenAI
chunks out. deepseek-recipe does the DSV4 work (conversion, prompt rendering, DSML parsing).

deepseek-recipe 0.2.0, as found by experiment (pinned in tests/engine/test_frontend.py):
- Thinking: it ignores `chat_template_kwargs`; we pass `thinking` / `enable_thinking` from it as
  `ConversionOptions(default_thinking_mode=...)` (default off). The body's own `thinking`
  object and `reasoning_effort` still win.
- tool_choice: auto, none, required, or a named function (required, with that tool only); the
  answer keeps to it and to `parallel_tool_calls` by constrained decoding (tool_choice_decoding.py).
  Thinking mode refuses required and named (400), as does a name not in `tools`.
- Sampling: it forces temperature = top_p = 1.0 in thinking mode; explicit values win here.
- Messages: read as SGLang's DeepSeek-V4 path hands them to the recipe (`_sglang_messages`): a
  `developer` message is a system message (the recipe knows no such role), and tool-call
  `arguments` given as a JSON object become its JSON text.
- Outputs: see engine/outputs.py (EOS, stop strings, usage). With `tool_call_parser="sglang"`
  SGLang's DeepSeek-V4 detector parses the tool calls instead (engine/sglang_tool_calls.py).
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import deepseek_recipe as dr

from . import tool_choice_decoding
from .config import TOOL_CALL_PARSERS, ModelConfig
from .openai_request import OpenAIRequest
from .outputs import ChatOutput, CompletionOutput, TokenEventLike, dumps_compact, sglext
from .prepared_request import Bootstrap, PreparedRequest
from .request import SEED_MAX, SamplingParams
from .request_limits import NUMBER, Field, RequestError, check_fields, check_values
from .sglang_tool_calls import SglangToolCallOutput
from .tokenizer import DSV4Tokenizer

__all__ = ["Frontend", "PreparedRequest", "RequestError"]

_MAX_STOP = 16
_TOOL_CHOICES = ("auto", "none", "required")
U32 = 2**32 - 1  # deepseek-recipe's max_tokens is a u32
# SGLang's PD fields, which a PD router adds to the body it sends both halves.
BOOTSTRAP_FIELDS = {
    "bootstrap_host": Field((str,)),
    "bootstrap_port": Field((int,), 1, 65535),
    "bootstrap_room": Field((int,), 0, 2**63 - 1),
}

# Top-level fields and what they may hold. Fields the engine ignores are checked too where
# OpenAI or deepseek-recipe define them, so that a wrong type is a 400 naming the field.
_COMMON = {
    "model": Field((str,)),
    "stream": Field((bool,)),
    "max_tokens": Field((int,), 1, U32),
    "temperature": Field(NUMBER, 0, 2),
    "top_p": Field(NUMBER, 0, 1, low_open=True),
    "seed": Field((int,), 0, SEED_MAX),
    "stop": Field((str, list)),
    "stream_options": Field((dict,)),
    "stop_token_ids": Field((list,)),
    "n": Field((int,), 1, 128),
    "presence_penalty": Field(NUMBER, -2, 2),
    "frequency_penalty": Field(NUMBER, -2, 2),
    "user": Field((str,)),
    "logit_bias": Field((dict,)),
    # SGLang's: `sglext.cached_tokens_details` in the answer (openai_request.py)
    "return_cached_tokens_details": Field((bool,)),
    **BOOTSTRAP_FIELDS,
}
_CHAT = {
    **_COMMON,
    "messages": Field((list,)),
    "tools": Field((list,)),
    "tool_choice": Field((str, dict)),
    "chat_template_kwargs": Field((dict,)),
    "max_completion_tokens": Field((int,), 1, U32),
    "logprobs": Field((bool,)),
    "top_logprobs": Field((int,), 0, 20),
    "parallel_tool_calls": Field((bool,)),
    "response_format": Field((dict,)),
    "reasoning_effort": Field((str, dict)),
    "thinking": Field((dict,)),
    "metadata": Field((dict,)),
    "store": Field((bool,)),
}
_COMPLETION = {
    **_COMMON,
    "prompt": Field((str, list)),
    "skip_special_tokens": Field((bool,)),
    "logprobs": Field((int,), 0, 5),
    "echo": Field((bool,)),
    "suffix": Field((str,)),
}
# NOTE: what deepseek-recipe and the tokenizer raise on input they cannot take, besides
# ConversionError. The edge (request_limits.py) keeps such input out; this is the last line.
_INPUT_ERRORS = (OverflowError, RecursionError, UnicodeError, TypeError)
_PROBE_MESSAGES = [{"role": "user", "content": "x"}]
# What answers a chat request, by EngineConfig.tool_call_parser.
_CHAT_OUTPUTS: dict[str, type[ChatOutput]] = {"deepseek-recipe": ChatOutput, "sglang": SglangToolCallOutput}
assert tuple(_CHAT_OUTPUTS) == TOOL_CALL_PARSERS


def _from_conversion_error(exc: dr.ConversionError) -> RequestError:
    try:
        message = json.loads(exc.body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = str(exc)
    hit = re.search(r"[Ii]nvalid (?:value for )?'?([a-z_]+)", message)
    param = hit.group(1) if hit else None
    if param == "tool_call" or "tool_choice" in message:
        param = "tool_choice"
    elif param not in _CHAT:
        param = "tools" if "schema for function" in message else "messages" if "messages" in message.lower() else None
    return RequestError(exc.status_code if 400 <= exc.status_code < 500 else 400, message, param)


def _converts(body: dict[str, Any], options: dr.ConversionOptions) -> bool:
    try:
        dr.ChatCompletionRequest(body).convert(options)
    except Exception:  # noqa: BLE001 - any refusal counts; this only locates one
        return False
    return True


def _locate(body: dict[str, Any], options: dr.ConversionOptions) -> str | None:
    """The field (`messages[2]`, `tools[0]`, `response_format`, ...) that makes deepseek-recipe
    refuse `body`, found by converting it field by field beside one plain message; None when
    no single field does. Runs only for a refused body."""
    base = {"model": body["model"], "messages": _PROBE_MESSAGES, "stream": body.get("stream") is True}
    for name, value in body.items():
        if name in ("model", "messages", "stream") or _converts({**base, name: value}, options):
            continue
        if name == "tools" and isinstance(value, list):
            return next(
                (f"tools[{i}]" for i, t in enumerate(value) if not _converts({**base, "tools": [t]}, options)), "tools"
            )
        return name
    messages = body.get("messages")
    if isinstance(messages, list):
        for i, m in enumerate(messages):
            if isinstance(m, dict) and m.get("role") in ("tool", "assistant"):
                continue  # these need the turns before them: judged with the whole list below
            if not _converts({**base, "messages": [m]}, options):
                return f"messages[{i}]"
        return "messages"
    return None


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _sglang_messages(messages: Any) -> Any:
    """`messages` as SGLang's DeepSeek-V4 serving hands them to deepseek-recipe (its
    `deepseek_recipe_renderer.pre_normalize`): the OpenAI SDK's `developer` role as `system`,
    tool-call arguments sent as an object as their compact JSON. Anything else is left for the
    recipe to judge."""
    if not isinstance(messages, list):
        return messages
    return [_sglang_message(m) if isinstance(m, dict) else m for m in messages]


def _sglang_message(message: dict[str, Any]) -> dict[str, Any]:
    message = {**message, "role": "system"} if message.get("role") == "developer" else message
    calls = message.get("tool_calls")
    if isinstance(calls, list) and any(isinstance(_arguments(c), dict) for c in calls):
        message = {**message, "tool_calls": [_with_json_arguments(c) for c in calls]}
    return message


def _arguments(call: Any) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    return function.get("arguments") if isinstance(function, dict) else None


def _with_json_arguments(call: Any) -> Any:
    arguments = _arguments(call)
    if not isinstance(arguments, dict):
        return call
    text = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
    return {**call, "function": {**call["function"], "arguments": text}}


def _single_prompt(prompt: Any) -> Any:
    """A completion `prompt` in SGLang's batch form holding one prompt (a list of one string or of
    one list of ids; LangChain's OpenAI LLM always sends a list) as that prompt. A batch of more
    is refused: the answer has one choice."""
    if not (isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt)):
        return prompt
    if len(prompt) > 1:
        raise RequestError(400, "batch prompts are not supported: send one prompt per request", "prompt")
    return prompt[0]


def bootstrap_fields(body: dict[str, Any]) -> Bootstrap | None:
    """The PD bootstrap fields: all three, or none (a request for a unified server)."""
    given = [name for name in BOOTSTRAP_FIELDS if body.get(name) is not None]
    if not given:
        return None
    missing = [name for name in BOOTSTRAP_FIELDS if name not in given]
    if missing:
        raise RequestError(400, f"'{missing[0]}' is required with {', '.join(given)}", missing[0])
    return Bootstrap(body["bootstrap_host"], body["bootstrap_port"], body["bootstrap_room"])


def stop_strings(body: dict[str, Any]) -> tuple[str, ...]:
    """`body`'s `stop` (a string or a list of them) as a tuple, checked."""
    stop = body.get("stop")
    stops = tuple([stop] if isinstance(stop, str) else stop or ())
    if len(stops) > _MAX_STOP or not all(isinstance(s, str) and s for s in stops):
        raise RequestError(400, f"'stop' must be up to {_MAX_STOP} non-empty strings", "stop")
    return stops


class Frontend:
    """OpenAI bodies -> `PreparedRequest`; engine events -> OpenAI chunks (via deepseek-recipe)."""

    def __init__(
        self,
        tokenizer: DSV4Tokenizer,
        model_name: str = "dsv4-mini",
        max_context: int = ModelConfig().max_context,
        tool_call_parser: str = TOOL_CALL_PARSERS[0],
    ) -> None:
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.max_context = max_context
        self.chat_output = _CHAT_OUTPUTS[tool_call_parser]
        self.encoding = dr.DeepseekV4Encoding().with_tokenizer(tokenizer.recipe)

    # ---- requests -------------------------------------------------------------------------

    def prepare_chat(self, body: Any) -> PreparedRequest:
        """Validate and convert a /v1/chat/completions body; raise RequestError on bad input."""
        body = self._common_checks(body, _CHAT)
        if body.get("messages") is None:
            raise RequestError(400, "'messages' is a required property", "messages")
        choice = body.get("tool_choice")
        function = choice.get("function") if isinstance(choice, dict) else None
        named = isinstance(function, dict) and isinstance(function.get("name"), str)
        if choice is not None and not (choice in _TOOL_CHOICES or named and choice.get("type") == "function"):
            raise RequestError(
                400, f"tool_choice must be one of {_TOOL_CHOICES} or a function, got {_short(choice)}", "tool_choice"
            )
        thinking = self._thinking_flag(body.get("chat_template_kwargs") or {})
        model = body.get("model") or self.model_name
        converted = {**body, "model": model, "messages": _sglang_messages(body["messages"])}
        if converted.get("max_tokens") is None and converted.get("max_completion_tokens") is not None:
            converted["max_tokens"] = converted["max_completion_tokens"]
        options = dr.ConversionOptions(default_thinking_mode=thinking).with_model_alias(
            model, dr.ModelVersion.DeepseekV4Pro
        )
        try:
            conv = dr.ChatCompletionRequest(converted).convert(options)
        except dr.ConversionError as exc:
            err = _from_conversion_error(exc)
            err.param = err.param or _locate(converted, options)
            raise err from None
        except ValueError as exc:  # the body does not parse as a chat request
            raise RequestError(400, str(exc), _locate(converted, options)) from None
        except _INPUT_ERRORS as exc:
            raise RequestError(
                400, f"the request cannot be converted: {type(exc).__name__}", _locate(converted, options)
            ) from None
        if any(m.image_sources for m in conv.conversation.messages):
            raise RequestError(400, "this model does not accept images", "messages")
        try:
            prompt_ids = self.encoding.encode(conv.conversation)
        except (RuntimeError, *_INPUT_ERRORS) as exc:
            raise RequestError(400, f"cannot encode the prompt: {_short(str(exc))}", "messages") from None
        self.check_context(len(prompt_ids), "messages")
        try:
            max_tokens = conv.resolve_max_tokens(len(prompt_ids), self.max_context)
        except dr.ConversionError as exc:
            err = _from_conversion_error(exc)
            err.param, err.code = "max_tokens", "context_length_exceeded"
            raise err from None
        io = conv.inference_options
        params = self.sampling(body, max_tokens, io.temperature, io.top_p, io.seed)
        constraint = tool_choice_decoding.for_request(body, self.tokenizer)
        if constraint is not None:
            params = dataclasses.replace(params, constraint=constraint)
        return OpenAIRequest(
            rid=f"chatcmpl-{uuid.uuid4().hex}",
            model=model,
            prompt_ids=prompt_ids,
            params=params,
            stream=conv.stream,
            include_usage=self._include_usage(body),
            thinking=conv.conversation.thinking_mode,
            conversation=conv,
            bootstrap=bootstrap_fields(body),
            return_cached_tokens_details=body.get("return_cached_tokens_details") is True,
        )

    def prepare_completion(self, body: Any) -> PreparedRequest:
        """Validate a /v1/completions body: a raw prompt encoded with the full vocabulary, so
        special-token spellings become special ids (the harness's --raw oracle relies on it)."""
        body = self._common_checks(body, _COMPLETION)
        if body.get("n") not in (None, 1):  # one choice would answer a request for several
            raise RequestError(400, "Invalid n value (currently only n = 1 is supported)", "n")
        prompt = _single_prompt(body.get("prompt"))
        ids_given = isinstance(prompt, list) and all(
            type(i) is int and 0 <= i < self.tokenizer.vocab_size for i in prompt
        )
        try:
            prompt_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt) if ids_given else []
        except _INPUT_ERRORS as exc:
            raise RequestError(400, f"cannot encode the prompt: {type(exc).__name__}", "prompt") from None
        if not prompt_ids:
            raise RequestError(400, "'prompt' must be a non-empty string or list of token ids", "prompt")
        requested = body.get("max_tokens")
        self.check_context(len(prompt_ids), "prompt", requested)
        params = self.sampling(body, requested or self.max_context - len(prompt_ids), 1.0, 1.0, body.get("seed"))
        return OpenAIRequest(
            rid=f"cmpl-{uuid.uuid4().hex}",
            model=body.get("model") or self.model_name,
            prompt_ids=prompt_ids,
            params=params,
            stream=bool(body.get("stream")),
            include_usage=self._include_usage(body),
            skip_special_tokens=body.get("skip_special_tokens") is not False,
            stop=stop_strings(body),
            bootstrap=bootstrap_fields(body),
            return_cached_tokens_details=body.get("return_cached_tokens_details") is True,
        )

    def _common_checks(self, body: Any, fields: dict[str, Field]) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise RequestError(400, "the request body must be a JSON object")
        check_values(body)  # what reached us without the HTTP edge (request_limits.parse_json) too
        check_fields(body, fields)
        if body.get("stream_options") is not None and not body.get("stream"):
            raise RequestError(400, "stream_options should be set along with stream = true", "stream_options")
        self.check_token_ids(body.get("stop_token_ids") or [], "stop_token_ids")
        stop_strings(body)
        return body

    def check_token_ids(self, ids: list[Any], param: str) -> None:
        """Refuse (400, naming `param`) a list holding anything but token ids of this model."""
        if not all(type(i) is int and 0 <= i < self.tokenizer.vocab_size for i in ids):
            raise RequestError(400, f"'{param}' must be token ids of this model", param)

    def check_context(self, prompt_tokens: int, param: str, max_tokens: int | None = None) -> None:
        """Refuse (400) a prompt, or a prompt with `max_tokens` to generate, beyond the context."""
        if prompt_tokens + (max_tokens or 1) > self.max_context:
            asked = (
                f"requested {prompt_tokens} in the prompt and {max_tokens} to generate"
                if max_tokens
                else f"your prompt has {prompt_tokens} tokens"
            )
            raise RequestError(
                400,
                f"This model's maximum context length is {self.max_context} tokens. However, {asked}.",
                "max_tokens" if max_tokens and prompt_tokens < self.max_context else param,
                "context_length_exceeded",
            )

    @staticmethod
    def _thinking_flag(kwargs: dict[str, Any]) -> bool:
        for key in ("thinking", "enable_thinking"):
            if key in kwargs:
                if not isinstance(kwargs[key], bool):
                    raise RequestError(400, f"chat_template_kwargs.{key} must be a boolean", "chat_template_kwargs")
                return kwargs[key]
        return False

    @staticmethod
    def _include_usage(body: dict[str, Any]) -> bool:
        return bool((body.get("stream_options") or {}).get("include_usage")) and bool(body.get("stream"))

    @staticmethod
    def sampling(
        body: dict[str, Any], max_tokens: int, temperature: float | None, top_p: float | None, seed: int | None
    ) -> SamplingParams:
        """Explicit temperature / top_p win (SGLang); unset ones take the recipe's value (or 1.0)."""
        t, p = body.get("temperature"), body.get("top_p")
        try:
            return SamplingParams(
                max_tokens=max_tokens,
                temperature=float(t if t is not None else temperature or 1.0),
                top_p=float(p if p is not None else top_p or 1.0),
                seed=seed,
                stop_token_ids=tuple(body.get("stop_token_ids") or ()),
            )
        except ValueError as exc:
            raise RequestError(400, str(exc), str(exc).split()[0]) from None

    # ---- outputs --------------------------------------------------------------------------

    async def stream_chat(
        self, req: PreparedRequest, events: AsyncIterator[TokenEventLike], output: type[ChatOutput] | None = None
    ) -> AsyncIterator[str]:
        """SSE data payloads of a streamed chat request: chunk JSON strings, then `[DONE]`.

        Ends early when the parser hit a stop string. On abort the payloads just end, with
        no finish chunk and no `[DONE]`. The caller owns `events` and closes it afterwards,
        which aborts the engine request if it is still running. `output` replaces ChatOutput
        (the `parser-split` fault's parse, engine/stream_parse_fault.py) for this request.
        """
        out = (output or self.chat_output)(req, self.tokenizer)
        try:
            async for event in events:
                for text in out.feed_json(event):
                    yield text
                if out.done or out.aborted:
                    break
            if out.done:
                yield dr.ChatCompletionResponse.sse_done_data() or "[DONE]"
        finally:
            out.close()

    async def complete_chat(self, req: PreparedRequest, events: AsyncIterator[TokenEventLike]) -> dict[str, Any] | None:
        """The whole chat.completion object, or None when the request was aborted."""
        out = self.chat_output(req, self.tokenizer)
        response: dr.ChatCompletionResponse | None = None
        ext: dict[str, Any] | None = None
        try:
            async for event in events:
                if response is None:
                    response = dr.ChatCompletionResponse(
                        req.rid, req.model, req.created, event.prompt_tokens, event.cached_tokens
                    )
                for chunk in out.feed(event):
                    response.accumulate(chunk)
                ext = sglext(req, event.cached_tokens, event.cached_tokens_host)
                if out.done or out.aborted:
                    break
        finally:
            out.close()
        if response is None or not out.done:
            return None
        whole = out.whole(json.loads(response.to_json()))
        return whole if ext is None else {**whole, "sglext": ext}

    async def stream_completion(
        self, req: PreparedRequest, events: AsyncIterator[TokenEventLike]
    ) -> AsyncIterator[str]:
        """SSE data payloads of a streamed /v1/completions request; same contract as `stream_chat`."""
        out = CompletionOutput(req, self.tokenizer)
        async for event in events:
            text = out.feed(event)
            if text or out.done:
                yield dumps_compact(out.chunk(text, out.finish_reason))
            if out.done or out.aborted:
                break
        if out.done:
            if (ext := out.sglext()) is not None:
                yield dumps_compact({**out.chunk(""), "choices": [], "usage": None, "sglext": ext})
            if req.include_usage:
                yield dumps_compact({**out.chunk(""), "choices": [], "usage": out.usage()})
            yield "[DONE]"

    async def complete_completion(
        self, req: PreparedRequest, events: AsyncIterator[TokenEventLike]
    ) -> dict[str, Any] | None:
        """The whole text_completion object, or None when the request was aborted."""
        out = CompletionOutput(req, self.tokenizer)
        async for event in events:
            out.feed(event)
            if out.done or out.aborted:
                break
        return out.chunk(out.text, out.finish_reason, usage=True) if out.done else None
