"""Engine token events of one request in, OpenAI output out: `ChatOutput` (deepseek-recipe's
stream processor), `TextChatOutput` (the same with a tool parser of text after it, as SGLang
parses) and `CompletionOutput` (incremental detokenizing and stop strings).

deepseek-recipe 0.2.0, as found by experiment (pinned in tests/engine/test_frontend.py):
- EOS decodes to `<｜end▁of▁sentence｜>`, kept as content after prose: EOS and stop ids are
  pushed as an empty text chunk of one token instead (counted in usage, never shown).
- `stop` becomes `ParsingOptions.stop_sequences`: the processor cuts the text, finishes "stop"
  and reports `finished`; we stop there and the caller's close aborts the engine request.
- Usage rides on the finish chunk whatever `stream_options` says; `ChatOutput` restores
  OpenAI's semantics (none without `include_usage`; with it, a last chunk with `choices: []`).

SGLang's split of the cached prompt tokens by tier, `cached_tokens_details` ({"device": D,
"host": H}, D + H = cached_tokens; None when nothing was cached): /generate puts it in every
answer's meta_info (native_api.py); the OpenAI endpoints only for a request with
`return_cached_tokens_details` (openai_request.py), as the answer's top-level `"sglext":
{"cached_tokens_details": ...}`, streamed in a chunk of its own with `choices: []` after the
finish chunk and before the usage chunk (SGLang's serving_chat.py / serving_completions.py).
"""

from __future__ import annotations

import json
from typing import Any, Protocol

import deepseek_recipe as dr

from .openai_request import wants_cached_tokens_details
from .prepared_request import PreparedRequest
from .request import FinishReason
from .tokenizer import DSV4Tokenizer, IncrementalDecoder

_RECIPE_FINISH = {
    FinishReason.STOP: dr.InferenceFinishReason.Stop,
    FinishReason.LENGTH: dr.InferenceFinishReason.Length,
}


def dumps_compact(d: dict[str, Any]) -> str:
    return json.dumps(d, ensure_ascii=False, separators=(",", ":"))


def cached_tokens_details(cached_tokens: int, cached_tokens_host: int) -> dict[str, int] | None:
    """SGLang's `cached_tokens_details` of a request (its scheduler's
    `_get_cached_tokens_details`): None when no prompt token was cached, else where they were
    found. No "storage" key: SGLang adds one only with an L3 storage tier, which this engine has not."""
    if cached_tokens <= 0:
        return None
    return {"device": cached_tokens - cached_tokens_host, "host": cached_tokens_host}


def sglext(req: PreparedRequest, cached_tokens: int, cached_tokens_host: int) -> dict[str, Any] | None:
    """The answer's `sglext` object, or None when there is none to give (SGLang leaves it out)."""
    details = cached_tokens_details(cached_tokens, cached_tokens_host)
    if details is None or not wants_cached_tokens_details(req):
        return None
    return {"cached_tokens_details": details}


class TokenEventLike(Protocol):
    """What the engine yields per step for one request (server_loop.TokenEvent)."""

    token_ids: list[int]
    finish_reason: FinishReason | None
    prompt_tokens: int
    cached_tokens: int
    cached_tokens_host: int  # of cached_tokens, loaded back from the host tier


class ChatOutput:
    """deepseek-recipe's StreamProcessor for one chat request: TokenEvents in, chunks out."""

    def __init__(self, req: PreparedRequest, tokenizer: DSV4Tokenizer) -> None:
        assert req.conversation is not None
        self.req = req
        generator = dr.ChatCompletionRequest.chunk_generator(req.conversation, req.rid, req.model)
        self.processor = dr.StreamProcessor(generator, self.parsing_options(), tokenizer.recipe)
        self.silent_ids = {tokenizer.eos_token_id, *req.params.stop_token_ids}
        self.started = self.aborted = False

    def parsing_options(self) -> dr.ParsingOptions:
        assert self.req.conversation is not None
        return self.req.conversation.parsing_options

    @property
    def done(self) -> bool:
        """The processor completed: a finish was pushed or a stop string matched."""
        return self.processor.finished

    def feed(self, event: TokenEventLike) -> list[dr.ChatCompletionChunk]:
        """Push one engine event; returns the recipe chunks it produced (single-use objects)."""
        p, out = self.processor, []
        if self.done or self.aborted:
            return out
        if not self.started:
            self.started = True
            usage = dr.PromptUsage(prompt_tokens=event.prompt_tokens, prompt_cache_hit_tokens=event.cached_tokens)
            out += p.push(dr.InferenceChunk.ready(prompt_usage=usage))
        ids = [i for i in event.token_ids if i not in self.silent_ids]
        out += self.push_output(ids, final=event.finish_reason is not None)
        if p.finished:  # a stop string matched
            return out
        if len(ids) < len(event.token_ids):
            out += p.push(dr.InferenceChunk.text("", len(event.token_ids) - len(ids)))
        if event.finish_reason is FinishReason.ABORT:
            self.aborted = True
        elif event.finish_reason is not None:
            out += p.push(dr.InferenceChunk.finish(_RECIPE_FINISH[event.finish_reason]))
            out += p.finish()
        return out

    def push_output(self, ids: list[int], final: bool) -> list[dr.ChatCompletionChunk]:
        """Hand the processor one event's output ids (`final`: the request's last event)."""
        return self.processor.push(dr.InferenceChunk.tokens(ids)) if ids else []

    def feed_json(self, event: TokenEventLike) -> list[str]:
        """`feed`, as chunk JSON with OpenAI's usage semantics: the usage chunk (with
        `include_usage`) comes last, after the finish chunk and SGLang's `sglext` chunk (with
        `return_cached_tokens_details`)."""
        texts, tail = [], []
        for chunk in self.feed(event):
            text = chunk.to_json()
            if '"usage":{' in text:  # the finish chunk
                d = json.loads(text)
                usage = d.pop("usage")
                ext = sglext(self.req, event.cached_tokens, event.cached_tokens_host)
                if ext is not None:
                    tail.append({**d, "choices": [], "usage": None, "sglext": ext})
                if self.req.include_usage:
                    tail.append({**d, "choices": [], "usage": usage})
                    d["usage"] = None
                text = dumps_compact(d)
            texts.append(text)
        return texts + [dumps_compact(c) for c in tail]

    def whole(self, response: dict[str, Any]) -> dict[str, Any]:
        """The whole chat.completion object of a non-streamed request, from deepseek-recipe's."""
        return response

    def close(self) -> None:
        if not self.processor.finished:
            self.processor.close()


class TextChatOutput(ChatOutput):
    """ChatOutput for a server whose tool parser reads text, as SGLang's does: each engine event
    detokenized into one chunk of text, deepseek-recipe with tool parsing off doing reasoning,
    content, stop strings and usage, and `split` (the subclass's parser) turning each chunk of
    content into the text to show and the tool calls it completed."""

    def __init__(self, req: PreparedRequest, tokenizer: DSV4Tokenizer) -> None:
        super().__init__(req, tokenizer)
        self.decoder = IncrementalDecoder(tokenizer)  # special tokens spelled out, as DSML needs
        self.num_calls = 0

    def parsing_options(self) -> dr.ParsingOptions:
        given = super().parsing_options()
        return dr.ParsingOptions(
            parse_tool_calls=False,
            starts_in_tool_calls=False,
            parse_json_output=given.parse_json_output,
            thinking_initial_stage=given.thinking_initial_stage,
            stop_sequences=given.stop_sequences,
            special_tokens=given.special_tokens,
        )

    def push_output(self, ids: list[int], final: bool) -> list[dr.ChatCompletionChunk]:
        text = self.decoder.push(ids, final)  # one engine step's text: the chunk the parser sees
        return self.processor.push(dr.InferenceChunk.text(text, len(ids))) if ids or text else []

    def split(self, text: str, final: bool) -> tuple[str, list[dict[str, Any]]]:
        """One chunk of content in (`final`: the response's last chunk, where a parser that holds
        text back lets it go), the text to show and the OpenAI tool-call deltas it completed out."""
        raise NotImplementedError

    def feed_json(self, event: TokenEventLike) -> list[str]:
        return [split for text in super().feed_json(event) if (split := self._split_tool_calls(text)) is not None]

    def _split_tool_calls(self, text: str) -> str | None:
        """The chunk with its content split, or None where the parser held all of its text back
        and the chunk says nothing else (SGLang sends no chunk then)."""
        chunk, held = json.loads(text), False
        for choice in chunk["choices"]:
            delta, final = choice["delta"], choice.get("finish_reason") is not None
            given = delta.get("content")
            if isinstance(given, str) or final:
                content, calls = self.split(given if isinstance(given, str) else "", final)
                delta.pop("content", None)
                if content or (given == "" and not calls):  # an empty content delta stays as it came
                    delta["content"] = content
                if calls:
                    self.num_calls += len(calls)
                    delta["tool_calls"] = calls
                held = held or bool(given) and not content and not calls
            if choice.get("finish_reason") == "stop" and self.num_calls:
                choice["finish_reason"] = "tool_calls"  # as SGLang does once its parser found calls
        said = chunk.get("usage") or any(c["delta"] or c.get("finish_reason") for c in chunk["choices"])
        return None if held and not said else dumps_compact(chunk)


class CompletionOutput:
    """Text of a /v1/completions request: incremental detokenizing, stop strings, chunks."""

    def __init__(self, req: PreparedRequest, tokenizer: DSV4Tokenizer) -> None:
        self.req = req
        self.decoder = IncrementalDecoder(tokenizer, req.skip_special_tokens)
        self.silent_ids = {tokenizer.eos_token_id, *req.params.stop_token_ids}  # trimmed, as SGLang does
        self.text = ""  # emitted so far
        self._held = ""  # decoded but held back: it may start a stop string
        self.completion_tokens = self.prompt_tokens = self.cached_tokens = self.cached_tokens_host = 0
        self.finish_reason: str | None = None
        self.aborted = False

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def feed(self, event: TokenEventLike) -> str:
        """Push one engine event; returns the newly final text."""
        if self.done or self.aborted:
            return ""
        self.prompt_tokens, self.cached_tokens = event.prompt_tokens, event.cached_tokens
        self.cached_tokens_host = event.cached_tokens_host
        self.completion_tokens += len(event.token_ids)
        ids = [i for i in event.token_ids if i not in self.silent_ids]
        pending = self._held + self.decoder.push(ids, final=event.finish_reason is not None)
        for stop in self.req.stop:
            at = pending.find(stop)
            if at >= 0:
                pending, self.finish_reason = pending[:at], "stop"
        if event.finish_reason is FinishReason.ABORT:
            self.aborted = True
            return ""
        if event.finish_reason is not None and self.finish_reason is None:
            self.finish_reason = event.finish_reason.value
        keep = (
            0
            if self.done
            else max((k for s in self.req.stop for k in range(1, len(s)) if pending.endswith(s[:k])), default=0)
        )
        out, self._held = pending[: len(pending) - keep], pending[len(pending) - keep :]
        self.text += out
        return out

    def usage(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }

    def chunk(self, text: str, finish_reason: str | None = None, *, usage: bool = False) -> dict[str, Any]:
        """One text_completion object: a stream chunk, or the whole response (`usage=True`)."""
        d: dict[str, Any] = {
            "id": self.req.rid,
            "object": "text_completion",
            "created": self.req.created,
            "model": self.req.model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}],
        }
        if usage:
            d["usage"] = self.usage()
            if (ext := self.sglext()) is not None:
                d["sglext"] = ext
        return d

    def sglext(self) -> dict[str, Any] | None:
        return sglext(self.req, self.cached_tokens, self.cached_tokens_host)
