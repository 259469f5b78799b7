"""Exact assembly of OpenAI chat-completion deltas into one AssembledResponse (pure, sans-IO).

The assembler is fed the `data:` payload of each SSE event in order and notes every breach
of the streaming protocol it sees on the way, so the `stream_protocol` checker can report
them. It never raises on bad input: a server's garbage is a finding, not a crash.

What it takes in is bounded (`StreamBounds`, stream_reader.py, which also reads the lines and
events off the wire): past a bound the assembler stops taking input and says which bound in
`stopped_at_bound`; the client stops reading and closes the response. Lone UTF-16 surrogates
(valid JSON escapes, invalid text that nothing downstream can encode) are replaced by U+FFFD on
the way in and noted, so the rest of the harness only ever holds encodable text.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import msgspec

from dsv4bench.history.records import AssembledResponse, ToolCall
from dsv4bench.wire.stream_reader import DEFAULT_BOUNDS, StreamBounds

DONE = "[DONE]"
_SURROGATE = re.compile("[\ud800-\udfff]")
# NOTE: msgspec decodes a chunk in a third of json's time. Everything it accepts, json reads to
# the same value (big integers included), and it refuses what json would take with a surprise:
# lone surrogate escapes, numbers past a double's range (json: inf), nesting past Python's
# recursion limit. DeltaAssembler.feed gives those to json, so a chunk's value is always json's,
# and one msgspec took holds no lone surrogate (the collector's `clean`).
_fast_decode = msgspec.json.Decoder().decode


def replace_surrogates(text: str) -> tuple[str, bool]:
    """`text` with each lone surrogate replaced by U+FFFD, and whether there was one."""
    if _SURROGATE.search(text) is None:
        return text, False
    return _SURROGATE.sub("\ufffd", text), True


def clean_value(value: Any) -> Any:
    """A decoded JSON value as the history can hold it: lone surrogates replaced in every
    string, keys included, and null for each number JSON cannot hold (NaN, or past a double's
    range: json reads those, but a file with them is no JSON to other readers)."""
    if isinstance(value, str):
        return replace_surrogates(value)[0]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {clean_value(k): clean_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean_value(v) for v in value]
    return value


def safe_dumps(value: Any) -> str:
    """JSON text of a decoded value, whatever it holds (too deep: a placeholder)."""
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (ValueError, TypeError, RecursionError):
        return "<not serializable>"


def cache_tiers(message: dict[str, Any]) -> dict[str, Any] | None:
    """SGLang's `sglext.cached_tokens_details` of an answer or chunk ({"device": D, "host": H}),
    cleaned as usage is; None where it has none."""
    ext = message.get("sglext")
    return clean_usage(ext.get("cached_tokens_details")) if isinstance(ext, dict) else None


def clean_usage(value: Any) -> dict[str, Any] | None:
    """A `usage` object cleaned (clean_value); None when it is not an object or too deep."""
    if not isinstance(value, dict):
        return None
    try:
        return clean_value(value)
    except RecursionError:
        return None


def short_repr(value: Any, limit: int = 80) -> str:
    """repr() of at most `limit` characters of a server's value, for a protocol error."""
    text = value if isinstance(value, str) else str(value)
    return repr(replace_surrogates(text[:limit])[0])


def _loads(data: str) -> Any:
    """json.loads that reports nesting too deep to decode as ValueError, like any bad JSON."""
    try:
        return json.loads(data)
    except RecursionError as e:
        raise ValueError("nested too deep to decode") from e


class _Collector:
    """What assembly shares between streamed and non-streamed bodies: bounded protocol-error
    notes, the text budget, and the surrogate notes."""

    def __init__(self, response: AssembledResponse, bounds: StreamBounds) -> None:
        self.response = response
        self.bounds = bounds
        self._text_chars = 0
        self._errors_left = 0
        # True while the input at hand is known to hold no lone surrogate (see _fast_decode)
        self.clean = False

    def error(self, text: str) -> None:
        r = self.response
        if len(r.protocol_errors) < self.bounds.protocol_errors:
            r.protocol_errors.append(text)
            return
        self._errors_left += 1
        note = f"… and {self._errors_left:,} more protocol errors"
        if r.protocol_errors[-1].startswith("… and "):
            r.protocol_errors[-1] = note
        else:
            r.protocol_errors.append(note)

    def stop(self, detail: str) -> None:
        """Past a bound: note it once and take no more input."""
        r = self.response
        if r.stopped_at_bound is None:
            r.stopped_at_bound = detail
            r.protocol_errors.append(f"the harness stopped reading: {detail}")

    def text(self, owner: str, piece: str, have: int, limit: int | None = None) -> str:
        """`piece` cleaned of surrogates and clipped to the bounds (`have`: characters the owner
        already holds; `limit`: the owner's own bound, if any)."""
        if not self.clean:
            piece, had = replace_surrogates(piece)
            if had and owner not in self.response.surrogates_replaced:
                self.response.surrogates_replaced.append(owner)
        room = self.bounds.text_chars - self._text_chars
        reason = f"more than {self.bounds.text_chars:,} characters of text in one turn"
        if limit is not None and limit - have < room:
            room = limit - have
            reason = f"{owner} longer than {limit:,} characters"
        if len(piece) > room:
            self.stop(reason)
            piece = piece[: max(0, room)]
        self._text_chars += len(piece)
        return piece

    def field(self, where: str, value: Any) -> str | None:
        """A string field (id, name, model, finish_reason): None stays None, anything else is
        made a string, noted, and cleaned of surrogates."""
        if value is None:
            return None
        if not isinstance(value, str):
            value = safe_dumps(value)
            self.error(f"{where} is not a string: {short_repr(value)}")
        elif self.clean and len(value) <= self.bounds.raw_line_chars:
            return value
        value, had = replace_surrogates(value[: self.bounds.raw_line_chars])
        if had:
            self.error(f"{where}: lone UTF-16 surrogate (invalid Unicode), recorded as U+FFFD")
        return value


class DeltaAssembler:
    """Accumulates chunks of one streamed choice (n=1)."""

    def __init__(self, bounds: StreamBounds = DEFAULT_BOUNDS) -> None:
        self.response = AssembledResponse(stream=True)
        self.bounds = bounds
        self._c = _Collector(self.response, bounds)
        self._calls: dict[int, ToolCall] = {}
        self._latest_call: int | None = None  # the highest tool-call index started so far
        # (index, breach) already noted: a server that repeats the name in every delta is one
        # finding per call, not one per chunk
        self._identity_noted: set[tuple[int, str]] = set()
        self._finished_at_chunk: int | None = None
        self._clean_id: str | None = None  # an id that field() took as it is, with no note

    @property
    def stopped(self) -> bool:
        """True once a bound was passed: the caller should stop reading."""
        return self.response.stopped_at_bound is not None

    def stop(self, detail: str) -> None:
        """The reader passed a bound of its own (an SSE line or event too long)."""
        self._c.stop(detail)

    def feed(self, data: str) -> bool:
        """Consume one SSE data payload. Returns True when it carried model output (a token)."""
        r = self.response
        if r.stopped_at_bound is not None:
            return False
        if r.saw_done:
            self._c.error(f"data after [DONE]: {short_repr(data)}")
            return False
        if not data.endswith("}") and data.strip() == DONE:  # a chunk, as JSON ends in "}"
            r.saw_done = True
            return False
        r.chunks += 1
        try:
            chunk = _fast_decode(data)
            self._c.clean = True
        except (ValueError, RecursionError):
            self._c.clean = False
            try:
                chunk = _loads(data)
            except ValueError:
                self._c.error(f"chunk {r.chunks} is not JSON: {short_repr(data)}")
                return False
        if not isinstance(chunk, dict):
            self._c.error(f"chunk {r.chunks} is not an object")
            return False
        if "error" in chunk and "choices" not in chunk:
            err = chunk["error"]
            msg = err.get("message") if isinstance(err, dict) else err
            self._c.error(f"error event mid-stream: {replace_surrogates(str(msg)[:120])[0]}")
            return False
        self._note_id(chunk)
        if isinstance(chunk.get("usage"), dict):
            r.usage = clean_usage(chunk["usage"])
        if (tiers := cache_tiers(chunk)) is not None:
            r.cached_tokens_details = tiers
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            self._c.error(f"chunk {r.chunks}: choices is not a list")
            return False
        carried = False
        for choice in choices:
            if not isinstance(choice, dict):
                self._c.error(f"chunk {r.chunks}: choice is not an object")
                continue
            if choice.get("index", 0) != 0:
                continue  # n>1 is not what agents ask for; ignore other choices
            carried |= self._feed_choice(choice)
        return carried

    def _note_id(self, chunk: dict[str, Any]) -> None:
        r = self.response
        raw_id = chunk.get("id")
        if raw_id is not None and raw_id == self._clean_id and r.model is not None:
            return  # the id and model seen before, taken in clean: nothing to note
        cid = self._c.field("id", raw_id)
        if r.response_id is None:
            r.response_id = cid
        elif cid is not None and cid != r.response_id:
            self._c.error(f"chunk {r.chunks}: id changed from {short_repr(r.response_id)} to {short_repr(cid)}")
        if r.model is None and chunk.get("model"):
            r.model = self._c.field("model", chunk["model"])
        if self._c.clean and isinstance(raw_id, str) and raw_id == r.response_id:
            self._clean_id = raw_id

    def _feed_choice(self, choice: dict[str, Any]) -> bool:
        r = self.response
        delta = choice.get("delta") or {}
        carried = False
        if not isinstance(delta, dict):
            self._c.error(f"chunk {r.chunks}: delta is not an object")
            delta = {}
        content = delta.get("content")
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        calls = delta.get("tool_calls") or []
        has_output = bool(content) or bool(reasoning) or bool(calls)
        if has_output and self._finished_at_chunk is not None:
            self._c.error(f"chunk {r.chunks}: delta after finish_reason (chunk {self._finished_at_chunk})")
        if content is not None and not isinstance(content, str):
            self._c.error(f"chunk {r.chunks}: content is not a string")
        if reasoning and not isinstance(reasoning, str):
            self._c.error(f"chunk {r.chunks}: reasoning is not a string")
        if not isinstance(calls, list):  # one call as an object, say: noted, or its calls would vanish unsaid
            self._c.error(f"chunk {r.chunks}: tool_calls is not a list")
        if isinstance(content, str) and content:
            r.content += self._c.text("content", content, len(r.content))
            carried = True
        if isinstance(reasoning, str) and reasoning:
            r.reasoning += self._c.text("reasoning", reasoning, len(r.reasoning))
            carried = True
        if isinstance(calls, list):
            for tc in calls:
                if self.stopped:
                    break
                carried |= self._feed_call(tc)
        fr = choice.get("finish_reason")
        if fr is not None:
            fr = self._c.field("finish_reason", fr)
            if self._finished_at_chunk is not None and fr != r.finish_reason:
                self._c.error(
                    f"chunk {r.chunks}: second finish_reason {short_repr(fr)} after {short_repr(r.finish_reason)}"
                )
            r.finish_reason = fr
            if self._finished_at_chunk is None:
                self._finished_at_chunk = r.chunks
        return carried

    def _feed_call(self, tc: Any) -> bool:
        """One tool-call delta, merged by its index as a client merges it.

        Stream identity, as OpenAI, vLLM and SGLang send it: a call's first delta carries its id
        and name, later ones only argument text. So a later delta that sends the name again is a
        breach even when it is the same name (clients that join every delta's fields, as the
        OpenAI SDK's accumulator and many agent front ends do, read `read_fileread_file`); a
        different id at an index already used is a second call there; a delta for an earlier
        index once a later one has started is out of order. An id repeated unchanged is not a
        breach: SGLang sent the id with every delta of a call, and a client that keeps the first
        id gets the right one.
        """
        r = self.response
        if not isinstance(tc, dict):
            self._c.error(f"chunk {r.chunks}: tool call delta is not an object")
            return False
        idx = tc.get("index")
        if not isinstance(idx, int) or isinstance(idx, bool):
            self._c.error(f"chunk {r.chunks}: tool call delta without an integer index")
            idx = max(self._calls, default=-1) + 1 if tc.get("id") else max(self._calls, default=0)
        fn = tc.get("function") or {}
        if not isinstance(fn, dict):
            self._c.error(f"chunk {r.chunks}: tool call delta's function is not an object")
            fn = {}
        call = self._calls.get(idx)
        name = self._c.field(f"tool_calls[{idx}].function.name", fn.get("name"))
        call_id = self._c.field(f"tool_calls[{idx}].id", tc.get("id"))
        args = fn.get("arguments")
        latest = self._latest_call
        out_of_order = latest is not None and idx < latest
        if out_of_order:
            self._identity_breach(
                idx,
                "order",
                f"tool_calls[{idx}]: delta in chunk {r.chunks} after "
                f"tool_calls[{latest}] started (indices out of order)",
            )
        if call is None:
            if len(self._calls) >= self.bounds.tool_calls:
                self._c.stop(f"more than {self.bounds.tool_calls:,} tool calls in one turn")
                return False
            expected = 0 if latest is None else latest + 1
            if idx != expected and not out_of_order:
                self._c.error(f"chunk {r.chunks}: tool call index {idx} where {expected} was next (index gap)")
            if not call_id:
                self._c.error(f"tool_calls[{idx}]: first delta has no id")
            if not name:
                self._c.error(f"tool_calls[{idx}]: first delta has no function name")
            call = ToolCall(index=idx, id=call_id, name=name or None, arguments="")
            self._calls[idx] = call
            r.tool_calls.append(call)
            self._latest_call = idx if latest is None else max(latest, idx)
        else:
            if call_id and call.id and call_id != call.id:
                self._identity_breach(
                    idx,
                    "id",
                    f"tool_calls[{idx}]: a second call at index {idx} in chunk "
                    f"{r.chunks} (id changed from {short_repr(call.id)} to "
                    f"{short_repr(call_id)})",
                )
            if call_id and not call.id:
                call.id = call_id  # late, but the first delta's missing id is already noted
            if name and call.name:
                if name == call.name:
                    said = (
                        f"function name {short_repr(name)} sent again in chunk {r.chunks} (a client that "
                        f"joins deltas reads {short_repr(call.name + name)})"
                    )
                else:
                    said = (
                        f"function name sent again in chunk {r.chunks}, name changed from "
                        f"{short_repr(call.name)} to {short_repr(name)}"
                    )
                self._identity_breach(idx, "name", f"tool_calls[{idx}]: {said}")
            if name and not call.name:
                call.name = name  # late, but the first delta's missing name is already noted
        if isinstance(args, str):
            call.arguments += self._c.text(
                f"tool_calls[{idx}].arguments", args, len(call.arguments), self.bounds.argument_chars
            )
        elif args is not None:
            self._c.error(f"tool_calls[{idx}]: arguments fragment is not a string")
        return bool(name) or bool(args)

    def _identity_breach(self, idx: int, breach: str, detail: str) -> None:
        """Note a stream-identity breach once per call and kind (the first chunk it happened in)."""
        if (idx, breach) not in self._identity_noted:
            self._identity_noted.add((idx, breach))
            self._c.error(detail)

    def finish(self) -> AssembledResponse:
        """Close the stream (EOF). A finished stream that never said [DONE] is a protocol error;
        one that never finished at all is left for the `truncated` checker."""
        r = self.response
        if r.finish_reason is not None and not r.saw_done and not self.stopped:
            self._c.error("stream ended without [DONE]")
        r.tool_calls.sort(key=lambda c: c.index)
        return r


def assemble_completion(body: Any, bounds: StreamBounds = DEFAULT_BOUNDS) -> AssembledResponse:
    """Read a non-streamed chat completion body into the same shape as a stream."""
    r = AssembledResponse(stream=False, saw_done=True)
    c = _Collector(r, bounds)
    if not isinstance(body, dict):
        c.error("response body is not a JSON object")
        return r
    r.response_id = c.field("id", body.get("id"))
    r.model = c.field("model", body.get("model"))
    r.usage = clean_usage(body.get("usage"))
    r.cached_tokens_details = cache_tiers(body)
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        c.error("response has no choices")
        return r
    choice = choices[0]
    msg = choice.get("message") or {}
    if not isinstance(msg, dict):
        c.error("choices[0].message is not an object")
        msg = {}
    r.finish_reason = c.field("finish_reason", choice.get("finish_reason"))
    r.content = c.text("content", _text_field(c, "content", msg.get("content")), 0)
    reasoning = msg.get("reasoning_content") or msg.get("reasoning")
    r.reasoning = c.text("reasoning", _text_field(c, "reasoning_content", reasoning), 0)
    calls = msg.get("tool_calls") or []
    if not isinstance(calls, list):
        c.error("message.tool_calls is not a list")
        calls = []
    for i, tc in enumerate(calls):
        if i >= bounds.tool_calls:
            c.stop(f"more than {bounds.tool_calls:,} tool calls in one turn")
            break
        if not isinstance(tc, dict):
            c.error(f"tool_calls[{i}] is not an object")
            tc = {}
        fn = tc.get("function") or {}
        if not isinstance(fn, dict):
            c.error(f"tool_calls[{i}].function is not an object")
            fn = {}
        args = fn.get("arguments")
        if args is not None and not isinstance(args, str):
            args = safe_dumps(args)  # some servers send an object; the args checker judges the string
        call_id = c.field(f"tool_calls[{i}].id", tc.get("id"))
        name = c.field(f"tool_calls[{i}].function.name", fn.get("name"))
        arguments = c.text(f"tool_calls[{i}].arguments", args or "", 0, bounds.argument_chars)
        r.tool_calls.append(ToolCall(index=i, id=call_id, name=name, arguments=arguments))
        if not call_id:
            c.error(f"tool_calls[{i}]: no id")
    return r


def _text_field(c: _Collector, where: str, value: Any) -> str:
    """content / reasoning of a message: a string, or noted and serialized (content parts)."""
    if value is None or isinstance(value, str):
        return value or ""
    c.error(f"message.{where} is not a string")
    return safe_dumps(value)
