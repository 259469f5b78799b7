"""Turn-shape checks: finish_reason against what was sent, empty and truncated turns, stream faults.

Who judges which `finish_reason` value:

=================  ==================================================================
finish_reason      owner
=================  ==================================================================
`"tool_calls"`     finish_reason_mismatch when no call was sent (and empty_turn when no
                   content either: the calls were dropped)
`"stop"`           finish_reason_mismatch when calls were sent; empty_turn when nothing
`"length"`         truncated (with or without calls); never empty_turn
`None`             truncated (the stream or body ended without one); never empty_turn
anything else      finish_reason_mismatch (e.g. SGLang's `"abort"`); `"content_filter"`
                   and the legacy `"function_call"` are accepted
=================  ==================================================================
"""

from __future__ import annotations

from collections import Counter

from dsv4bench.checks.common import response_of
from dsv4bench.records import TurnContext, Verdict

KNOWN_FINISH_REASONS = frozenset({"stop", "tool_calls", "length", "content_filter", "function_call"})


def check_finish_reason_mismatch(ctx: TurnContext) -> list[Verdict]:
    """finish_reason that contradicts the turn: `"tool_calls"` without calls, `"stop"` with calls.

    An unrecognised finish_reason (e.g. `"abort"`, which SGLang sends for a request it
    aborted itself) is reported too: the client cannot act on it.
    """
    resp = response_of(ctx)
    reason, calls = resp.finish_reason, len(resp.tool_calls)
    if reason == "tool_calls" and calls == 0:
        return [Verdict("finish_reason_mismatch", "finish_reason 'tool_calls' but no tool calls", "finish_reason")]
    if reason == "stop" and calls > 0:
        names = ", ".join(str(c.name) for c in resp.tool_calls)
        detail = f"finish_reason 'stop' with {calls} tool call(s): {names}"
        return [Verdict("finish_reason_mismatch", detail, "finish_reason")]
    if reason is not None and reason not in KNOWN_FINISH_REASONS:
        return [Verdict("finish_reason_mismatch", f"unexpected finish_reason {reason!r}", "finish_reason")]
    return []


def check_empty_turn(ctx: TurnContext) -> list[Verdict]:
    """No content (after strip) and no tool calls, whatever the reasoning said.

    A turn that only thought and said nothing leaves the agent with nothing to do. Turns cut
    short (finish_reason `"length"` or None) are `truncated`, not empty.
    """
    resp = response_of(ctx)
    if resp.finish_reason in ("length", None) or resp.content.strip() or resp.tool_calls:
        return []
    said = f"reasoning only ({len(resp.reasoning)} chars)" if resp.reasoning.strip() else "no reasoning either"
    detail = f"no content and no tool calls, finish_reason {resp.finish_reason!r}; {said}"
    return [Verdict("empty_turn", detail, "content")]


def check_stream_protocol(ctx: TurnContext) -> list[Verdict]:
    """Stream-protocol faults: one verdict per `protocol_errors` entry, plus duplicate call ids.

    The SSE assembler records the faults it sees (index gaps, missing id or name on a call's
    first delta, deltas after finish, no `[DONE]`, undecodable chunks, fields of the wrong
    type, and a response past one of the harness's bounds, which it stopped reading: a line,
    event, argument or text too long, too many tool calls); this checker maps them to verdicts. It adds one check of its own: two calls of one turn sharing an id,
    which breaks the agent's matching of tool results to calls.
    """
    resp = response_of(ctx)
    verdicts = [Verdict("stream_protocol", error, "stream") for error in resp.protocol_errors]
    ids = Counter(c.id for c in resp.tool_calls if c.id)
    for call_id, n in ids.items():
        if n > 1:
            where = ",".join(f"tool_calls[{i}]" for i, c in enumerate(resp.tool_calls) if c.id == call_id)
            verdicts.append(Verdict("stream_protocol", f"tool call id {call_id!r} used by {n} calls", where))
    return verdicts


def check_truncated(ctx: TurnContext) -> list[Verdict]:
    """A turn cut short: finish_reason `"length"` (token limit) or None (ended without one).

    The detail says which, with `max_tokens` and the completion token count where known.
    A None finish_reason on a stream that saw `[DONE]` is still truncated: the server closed
    the stream cleanly but never said how the turn ended. A response the harness stopped
    reading at one of its bounds (`stopped_at_bound`) is not: `stream_protocol` reports it.
    """
    resp = response_of(ctx)
    if resp.stopped_at_bound is not None:
        return []  # the harness stopped reading, not the server: stream_protocol names the bound
    used = (resp.usage or {}).get("completion_tokens")
    limits = f" (max_tokens={ctx.max_tokens}, completion_tokens={used})"
    if resp.finish_reason == "length":
        return [Verdict("truncated", "finish_reason 'length': hit the token limit" + limits, "finish_reason")]
    if resp.finish_reason is None:
        how = "stream" if resp.stream else "response body"
        done = f", saw [DONE]={resp.saw_done}" if resp.stream else ""
        return [Verdict("truncated", f"{how} ended without a finish_reason{done}" + limits, "finish_reason")]
    return []
