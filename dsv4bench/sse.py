"""Exact assembly of OpenAI chat-completion deltas into one AssembledResponse (pure, sans-IO).

The assembler is fed the `data:` payload of each SSE event in order and notes every breach
of the streaming protocol it sees on the way, so the `stream_protocol` checker can report
them. It never raises on bad input: a server's garbage is a finding, not a crash.
"""

from __future__ import annotations

import json
from typing import Any

from .records import AssembledResponse, ToolCall

DONE = "[DONE]"


class DeltaAssembler:
    """Accumulates chunks of one streamed choice (n=1)."""

    def __init__(self) -> None:
        self.response = AssembledResponse(stream=True)
        self._calls: dict[int, ToolCall] = {}
        self._finished_at_chunk: int | None = None

    def feed(self, data: str) -> bool:
        """Consume one SSE data payload. Returns True when it carried model output (a token)."""
        r = self.response
        if r.saw_done:
            r.protocol_errors.append(f"data after [DONE]: {data[:80]!r}")
            return False
        if data.strip() == DONE:
            r.saw_done = True
            return False
        r.chunks += 1
        try:
            chunk = json.loads(data)
        except ValueError:
            r.protocol_errors.append(f"chunk {r.chunks} is not JSON: {data[:80]!r}")
            return False
        if not isinstance(chunk, dict):
            r.protocol_errors.append(f"chunk {r.chunks} is not an object")
            return False
        if "error" in chunk and "choices" not in chunk:
            err = chunk["error"]
            msg = err.get("message") if isinstance(err, dict) else err
            r.protocol_errors.append(f"error event mid-stream: {str(msg)[:120]}")
            return False
        self._note_id(chunk)
        if isinstance(chunk.get("usage"), dict):
            r.usage = chunk["usage"]
        carried = False
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict):
                r.protocol_errors.append(f"chunk {r.chunks}: choice is not an object")
                continue
            if choice.get("index", 0) != 0:
                continue  # n>1 is not what agents ask for; ignore other choices
            carried |= self._feed_choice(choice)
        return carried

    def _note_id(self, chunk: dict[str, Any]) -> None:
        r = self.response
        cid = chunk.get("id")
        if r.response_id is None:
            r.response_id = cid
        elif cid is not None and cid != r.response_id:
            r.protocol_errors.append(f"chunk {r.chunks}: id changed from {r.response_id!r} to {cid!r}")
        if r.model is None and chunk.get("model"):
            r.model = chunk["model"]

    def _feed_choice(self, choice: dict[str, Any]) -> bool:
        r = self.response
        delta = choice.get("delta") or {}
        carried = False
        if not isinstance(delta, dict):
            r.protocol_errors.append(f"chunk {r.chunks}: delta is not an object")
            delta = {}
        content = delta.get("content")
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        calls = delta.get("tool_calls") or []
        has_output = bool(content) or bool(reasoning) or bool(calls)
        if has_output and self._finished_at_chunk is not None:
            r.protocol_errors.append(f"chunk {r.chunks}: delta after finish_reason (chunk {self._finished_at_chunk})")
        if isinstance(content, str) and content:
            r.content += content
            carried = True
        if isinstance(reasoning, str) and reasoning:
            r.reasoning += reasoning
            carried = True
        if isinstance(calls, list):
            for tc in calls:
                carried |= self._feed_call(tc)
        fr = choice.get("finish_reason")
        if fr is not None:
            if self._finished_at_chunk is not None and fr != r.finish_reason:
                r.protocol_errors.append(f"chunk {r.chunks}: second finish_reason {fr!r} after {r.finish_reason!r}")
            r.finish_reason = fr
            if self._finished_at_chunk is None:
                self._finished_at_chunk = r.chunks
        return carried

    def _feed_call(self, tc: Any) -> bool:
        r = self.response
        if not isinstance(tc, dict):
            r.protocol_errors.append(f"chunk {r.chunks}: tool call delta is not an object")
            return False
        idx = tc.get("index")
        if not isinstance(idx, int):
            r.protocol_errors.append(f"chunk {r.chunks}: tool call delta without an integer index")
            idx = max(self._calls, default=-1) + 1 if tc.get("id") else max(self._calls, default=0)
        fn = tc.get("function") or {}
        name, args = fn.get("name"), fn.get("arguments")
        call = self._calls.get(idx)
        if call is None:
            expected = len(self._calls)
            if idx != expected:
                r.protocol_errors.append(f"chunk {r.chunks}: tool call index {idx} where {expected} was next (index gap)")
            if not tc.get("id"):
                r.protocol_errors.append(f"tool_calls[{idx}]: first delta has no id")
            if not name:
                r.protocol_errors.append(f"tool_calls[{idx}]: first delta has no function name")
            call = ToolCall(index=idx, id=tc.get("id"), name=name or None, arguments="")
            self._calls[idx] = call
            r.tool_calls.append(call)
        else:
            if tc.get("id") and call.id and tc["id"] != call.id:
                r.protocol_errors.append(f"tool_calls[{idx}]: id changed from {call.id!r} to {tc['id']!r}")
            if tc.get("id") and not call.id:
                call.id = tc["id"]
            if name and call.name and name != call.name:
                r.protocol_errors.append(f"tool_calls[{idx}]: name changed from {call.name!r} to {name!r}")
            if name and not call.name:
                call.name = name
        if isinstance(args, str):
            call.arguments += args
        elif args is not None:
            r.protocol_errors.append(f"tool_calls[{idx}]: arguments fragment is not a string")
        return bool(name) or bool(args)

    def finish(self) -> AssembledResponse:
        """Close the stream (EOF). A finished stream that never said [DONE] is a protocol error;
        one that never finished at all is left for the `truncated` checker."""
        r = self.response
        if r.finish_reason is not None and not r.saw_done:
            r.protocol_errors.append("stream ended without [DONE]")
        r.tool_calls.sort(key=lambda c: c.index)
        return r


def assemble_completion(body: Any) -> AssembledResponse:
    """Read a non-streamed chat completion body into the same shape as a stream."""
    r = AssembledResponse(stream=False, saw_done=True)
    if not isinstance(body, dict):
        r.protocol_errors.append("response body is not a JSON object")
        return r
    r.response_id = body.get("id")
    r.model = body.get("model")
    r.usage = body.get("usage") if isinstance(body.get("usage"), dict) else None
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        r.protocol_errors.append("response has no choices")
        return r
    choice = choices[0]
    msg = choice.get("message") or {}
    r.finish_reason = choice.get("finish_reason")
    r.content = msg.get("content") or ""
    r.reasoning = msg.get("reasoning_content") or msg.get("reasoning") or ""
    for i, tc in enumerate(msg.get("tool_calls") or []):
        fn = (tc or {}).get("function") or {}
        args = fn.get("arguments")
        if args is not None and not isinstance(args, str):
            args = json.dumps(args)  # some servers send an object; the args checker judges the string
        r.tool_calls.append(ToolCall(index=i, id=(tc or {}).get("id"), name=fn.get("name"), arguments=args or ""))
        if not (tc or {}).get("id"):
            r.protocol_errors.append(f"tool_calls[{i}]: no id")
    return r
