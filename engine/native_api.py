"""SGLang's native `/generate` API: its request body in, a `NativeRequest` out; the engine's
events in, SGLang's answers out. engine/server.py serves it on every server of the engine.

Request (the parts of SGLang's `GenerateReqInput` the engine has): exactly one of `text` (a
string, encoded with the full vocabulary as `/v1/completions` does) or `input_ids`;
`sampling_params` (`max_new_tokens`, SGLang's default 128, `temperature`, `top_p`, `top_k`,
`stop`, `stop_token_ids`, `ignore_eos`, `skip_special_tokens`, `sampling_seed`); `stream`; `rid`
(made when absent); the PD bootstrap fields, read as the OpenAI endpoints read them. A field
SGLang defines that the engine cannot honour (logprobs, images, LoRA, constrained decoding,
penalties, `n`, top-k other than all or 1) is a 400 naming it unless it holds its no-op value:
ignored, the answer would not be the one asked for. An unknown sampling parameter is a 400 too,
as in SGLang. Batches (lists of prompts) are refused.

Answer: `{"text", "output_ids", "meta_info": {"id", "finish_reason", "prompt_tokens",
"completion_tokens", "cached_tokens", "cached_tokens_details", "e2e_latency"}}`.
`cached_tokens_details` is SGLang's split of `cached_tokens` by tier, `{"device": D, "host": H}`,
or None when nothing was cached (outputs.py). `finish_reason` is None until the end,
then SGLang's object: `{"type": "stop", "matched": token id or stop string}`, `{"type":
"length", "length": n}` or `{"type": "abort", "message": ...}`; an aborted request is answered
(200), as SGLang answers it. Streamed: one `data:` payload per engine event, `text` the whole
text so far and `output_ids` the event's own ids, then `[DONE]`; `e2e_latency` comes with the
finish only, as in SGLang.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from .frontend import BOOTSTRAP_FIELDS, U32, Frontend, bootstrap_fields, stop_strings
from .outputs import CompletionOutput, TokenEventLike, cached_tokens_details, dumps_compact
from .prepared_request import PreparedRequest
from .request import HEALTH_PROBE_PREFIX, SEED_MAX, FinishReason
from .request_limits import INT_MAX, NUMBER, Field, RequestError, check_fields, check_values

DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's SamplingParams.max_new_tokens
TOP_K_ALL = -1  # SGLang's "no top-k"
_MAX_RID = 256  # characters: the rid is logged and kept by every server it reaches

_BATCHABLE = ("text", "sampling_params", "rid", "return_logprob")  # a list in any of these is a batch
_FIELDS = {  # checked once a batch is refused
    "text": Field((str,)),
    "input_ids": Field((list,)),
    "sampling_params": Field((dict,)),
    "stream": Field((bool,)),
    "rid": Field((str,)),
    "return_logprob": Field((bool,)),
    **BOOTSTRAP_FIELDS,
}
# Top-level fields of SGLang's the engine cannot honour: only their no-op value passes.
_FIELDS_NO_OP: dict[str, Any] = {
    "return_logprob": False,
    "input_embeds": None,
    "image_data": None,
    "video_data": None,
    "audio_data": None,
    "lora_path": None,
    "session_params": None,
    "custom_logit_processor": None,
    "return_hidden_states": False,
}

_SAMPLING = {
    "max_new_tokens": Field((int,), 1, U32),
    "temperature": Field(NUMBER, 0, 2),
    "top_p": Field(NUMBER, 0, 1, low_open=True),
    "top_k": Field((int,), TOP_K_ALL, INT_MAX),
    "stop": Field((str, list)),
    "stop_token_ids": Field((list,)),
    "ignore_eos": Field((bool,)),
    "skip_special_tokens": Field((bool,)),
    "sampling_seed": Field((int,), 0, SEED_MAX),
    # NOTE: no effect here: byte-level BPE never puts spaces between tokens, and every step is streamed.
    "spaces_between_special_tokens": Field((bool,)),
    "stream_interval": Field((int,), 1, INT_MAX),
    "n": Field((int,)),
    "min_new_tokens": Field((int,)),
    "min_p": Field(NUMBER),
    "frequency_penalty": Field(NUMBER),
    "presence_penalty": Field(NUMBER),
    "repetition_penalty": Field(NUMBER),
    "no_stop_trim": Field((bool,)),
    "json_schema": Field((str,)),
    "regex": Field((str,)),
    "ebnf": Field((str,)),
    "structural_tag": Field((str,)),
    "stop_regex": Field((str, list)),
    "logit_bias": Field((dict,)),
    "custom_params": Field((dict,)),
}
# Sampling parameters of SGLang's the sampler does not have: only their no-op value passes.
_SAMPLING_NO_OP: dict[str, Any] = {
    "n": 1,
    "min_new_tokens": 0,
    "min_p": 0,
    "frequency_penalty": 0,
    "presence_penalty": 0,
    "repetition_penalty": 1,
    "no_stop_trim": False,
    "json_schema": None,
    "regex": None,
    "ebnf": None,
    "structural_tag": None,
    "stop_regex": None,
    "logit_bias": None,
    "custom_params": None,
}
assert set(_SAMPLING_NO_OP) <= set(_SAMPLING)


@dataclass
class NativeRequest(PreparedRequest):
    """A checked `/generate` request."""

    arrival: float = field(default_factory=time.monotonic)  # for meta_info.e2e_latency


@contextlib.contextmanager
def _within(prefix: str) -> Iterator[None]:
    """Name a refusal of a nested field by its path (`sampling_params.stop`)."""
    try:
        yield
    except RequestError as err:
        if err.param:
            err.message = err.message.replace(f"'{err.param}'", f"'{prefix}.{err.param}'")
            err.param = f"{prefix}.{err.param}"
            err.args = (err.message,)
        raise


def _refuse_set(values: dict[str, Any], no_ops: dict[str, Any], prefix: str = "") -> None:
    for name, no_op in no_ops.items():
        value = values.get(name)
        if value is not None and value != no_op:
            where = f"{prefix}{name}"
            only = "" if no_op is None else f" other than {no_op!r}"
            raise RequestError(400, f"'{where}'{only} is not supported by this engine", where)


class NativeAPI:
    """`/generate` bodies -> `NativeRequest`; engine events -> SGLang's answers."""

    def __init__(self, frontend: Frontend) -> None:
        self.frontend, self.tokenizer = frontend, frontend.tokenizer

    def prepare(self, body: Any) -> NativeRequest:
        """Validate and convert a `/generate` body; raise RequestError on bad input."""
        if not isinstance(body, dict):
            raise RequestError(400, "the request body must be a JSON object")
        check_values(body)  # what reached us without the HTTP edge (request_limits.parse_json) too
        ids = body.get("input_ids")
        batched = [name for name in _BATCHABLE if isinstance(body.get(name), list)]
        if isinstance(ids, list) and ids and isinstance(ids[0], list):
            batched.insert(0, "input_ids")
        if batched:
            raise RequestError(
                400,
                f"batch requests are not supported: send one prompt per request ('{batched[0]}' is a list)",
                batched[0],
            )
        check_fields(body, _FIELDS)
        _refuse_set(body, _FIELDS_NO_OP)
        rid = self._rid(body.get("rid"))
        prompt_ids, prompt_param = self._prompt(body)
        sp: dict[str, Any] = body.get("sampling_params") or {}
        with _within("sampling_params"):
            stops = self._check_sampling(sp)
        requested = sp.get("max_new_tokens")
        try:
            self.frontend.check_context(len(prompt_ids), prompt_param, requested)
        except RequestError as err:
            if err.param == "max_tokens":
                err.param = "sampling_params.max_new_tokens"
            raise
        max_tokens = requested or min(DEFAULT_MAX_NEW_TOKENS, self.frontend.max_context - len(prompt_ids))
        with _within("sampling_params"):
            params = self.frontend.sampling(sp, max_tokens, 1.0, 1.0, sp.get("sampling_seed"))
        if sp.get("top_k") == 1:
            params = dataclasses.replace(params, temperature=0.0)  # top-1 sampling is greedy decoding
        if sp.get("ignore_eos"):
            params = dataclasses.replace(params, ignore_eos=True)
        return NativeRequest(
            rid=rid,
            model=self.frontend.model_name,
            prompt_ids=prompt_ids,
            params=params,
            stream=body.get("stream") is True,
            skip_special_tokens=sp.get("skip_special_tokens") is not False,
            stop=stops,
            bootstrap=bootstrap_fields(body),
        )

    @staticmethod
    def _rid(rid: str | None) -> str:
        if rid is None:
            return uuid.uuid4().hex  # as SGLang makes one
        if not 0 < len(rid) <= _MAX_RID:
            raise RequestError(400, f"'rid' must be 1 to {_MAX_RID} characters", "rid")
        if rid.startswith(HEALTH_PROBE_PREFIX):
            # NOTE: the counters and gauges leave such rids out: a client's would read as no traffic.
            raise RequestError(400, f"the rid prefix {HEALTH_PROBE_PREFIX!r} is reserved for health probes", "rid")
        return rid

    def _prompt(self, body: dict[str, Any]) -> tuple[list[int], str]:
        """The prompt's ids and the field they came from."""
        text, ids = body.get("text"), body.get("input_ids")
        if (text is None) == (ids is None):
            given = "both" if text is not None else "neither"
            raise RequestError(
                400,
                f"exactly one of 'text' and 'input_ids' is required, got {given}",
                "input_ids" if text is not None else "text",
            )
        if text is not None:
            prompt_ids = self.tokenizer.encode(text) if text else []
            if not prompt_ids:
                raise RequestError(400, "'text' must be a non-empty string", "text")
            return prompt_ids, "text"
        if not ids:
            raise RequestError(400, "'input_ids' must be a non-empty list of token ids", "input_ids")
        self.frontend.check_token_ids(ids, "input_ids")
        return list(ids), "input_ids"

    def _check_sampling(self, sp: dict[str, Any]) -> tuple[str, ...]:
        """Refuse what the engine cannot take (names relative to `sampling_params`); the stop strings."""
        unknown = next((name for name in sp if name not in _SAMPLING), None)
        if unknown is not None:
            raise RequestError(400, f"'{unknown}' is not a sampling parameter", unknown)
        check_fields(sp, _SAMPLING)
        _refuse_set(sp, _SAMPLING_NO_OP)
        top_k = sp.get("top_k")
        if top_k == 0:
            raise RequestError(400, "'top_k' must be -1 (all) or at least 1, got 0", "top_k")
        greedy = sp.get("temperature") == 0
        if top_k is not None and not (greedy or top_k in (TOP_K_ALL, 1) or top_k >= self.tokenizer.vocab_size):
            raise RequestError(
                400,
                f"'top_k' {top_k} is not supported by this engine: use -1 (all), 1 (greedy) or temperature 0",
                "top_k",
            )
        self.frontend.check_token_ids(sp.get("stop_token_ids") or [], "stop_token_ids")
        return stop_strings(sp)

    # ---- answers ---------------------------------------------------------------------------

    async def stream(self, req: NativeRequest, events: AsyncIterator[TokenEventLike]) -> AsyncIterator[str]:
        """SSE data payloads: one answer per engine event, then `[DONE]` once finished (an abort
        included, as SGLang ends its streams). The caller owns `events` and closes it."""
        out = NativeOutput(req, self.frontend)
        async for event in events:
            ids = out.feed(event)
            yield dumps_compact(out.answer(ids))
            if out.done:
                break
        if out.done:
            yield "[DONE]"

    async def collect(self, req: NativeRequest, events: AsyncIterator[TokenEventLike]) -> dict[str, Any] | None:
        """The whole answer, or None when the events ended without a finish."""
        out = NativeOutput(req, self.frontend)
        async for event in events:
            out.feed(event)
            if out.done:
                break
        return out.answer(out.output_ids) if out.done else None


class NativeOutput:
    """One `/generate` request's answers: `CompletionOutput` does the text (incremental
    detokenizing, stop strings, EOS and stop ids trimmed); this adds ids and SGLang's meta_info."""

    def __init__(self, req: NativeRequest, frontend: Frontend) -> None:
        self.req, self.tokenizer = req, frontend.tokenizer
        self.text = CompletionOutput(req, frontend.tokenizer)
        self.output_ids: list[int] = []
        self.finish: dict[str, Any] | None = None

    @property
    def done(self) -> bool:
        return self.finish is not None

    def feed(self, event: TokenEventLike) -> list[int]:
        """Push one engine event; returns its output ids."""
        if self.done:
            return []
        ids = list(event.token_ids)
        self.output_ids += ids
        self.text.feed(event)
        if self.text.aborted:
            self.finish = {"type": "abort", "message": "the request was aborted"}
        elif self.text.done:
            self.finish = self._finish(event)
        return ids

    def _finish(self, event: TokenEventLike) -> dict[str, Any]:
        if self.text.finish_reason == "length":
            return {"type": "length", "length": len(self.output_ids)}
        matched = self._matched_stop()
        if matched is None and event.finish_reason is FinishReason.STOP and self.output_ids:
            return {"type": "stop", "matched": self.output_ids[-1]}  # EOS or a stop token
        return {"type": "stop", "matched": matched}

    def _matched_stop(self) -> str | None:
        """The stop string the text was cut at, if any (it ends right where the text does)."""
        if not self.req.stop:
            return None
        silent = self.text.silent_ids
        whole = self.tokenizer.decode([i for i in self.output_ids if i not in silent], self.req.skip_special_tokens)
        return next((s for s in self.req.stop if whole.startswith(s, len(self.text.text))), None)

    def answer(self, ids: list[int]) -> dict[str, Any]:
        """SGLang's answer object with `ids` as its output ids: the whole text so far."""
        meta: dict[str, Any] = {
            "id": self.req.rid,
            "finish_reason": self.finish,
            "prompt_tokens": self.text.prompt_tokens,
            "completion_tokens": len(self.output_ids),
            "cached_tokens": self.text.cached_tokens,
            "cached_tokens_details": cached_tokens_details(self.text.cached_tokens, self.text.cached_tokens_host),
        }
        if self.done:
            meta["e2e_latency"] = time.monotonic() - self.req.arrival
        return {"text": self.text.text, "output_ids": ids, "meta_info": meta}
