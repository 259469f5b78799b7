"""Turn-shape checks: finish_reason against what was sent, empty and truncated turns, stream faults.

Who judges which `finish_reason` value (one owner per fault):

=================  ==================================================================
finish_reason      owner
=================  ==================================================================
at the token cap   finish_reason_mismatch for any value but `"length"` or None, when
                   `usage.completion_tokens` reached (or passed) the request's
                   `max_tokens`: the cap cut the turn and the finish_reason hides it.
                   The lie is the fault, so `truncated` stays silent (it owns the
                   honest `"length"`), and so do the checkers whose finding would only
                   restate the cut (`reasoning_only`, a `"required"` tool_choice left
                   without its call). One exception: `"stop"` exactly at the cap under
                   the request's own stop sequences (vLLM reports a stop string matched
                   in the cap's last token as `"stop"`)
`"tool_calls"`     finish_reason_mismatch when no call was sent (and empty_turn when
                   nothing at all either: the calls were dropped)
`"stop"`           finish_reason_mismatch when calls were sent; empty_turn when nothing
                   at all was sent (no content, reasoning or call) and the request had
                   no stop sequence and no prefilled assistant message that explains an
                   answer ending there; reasoning with nothing after it is
                   `reasoning_only`'s (checks/request_compliance.py), never empty_turn's
`"length"`         truncated (with or without calls); never empty_turn
`None`             truncated (the stream or body ended without one); never empty_turn
anything else      finish_reason_mismatch (e.g. SGLang's `"abort"`); `"content_filter"`
                   and the legacy `"function_call"` are accepted
=================  ==================================================================
"""

from __future__ import annotations

from collections import Counter

from dsv4bench.checks.common import response_of
from dsv4bench.history.records import TurnContext, Verdict

KNOWN_FINISH_REASONS = frozenset({"stop", "tool_calls", "length", "content_filter", "function_call"})


def cap_reached(ctx: TurnContext) -> tuple[int, int] | None:
    """(completion_tokens, max_tokens) when the answer used all the tokens its request allowed;
    None when it did not, or when either number is not a known integer (usage may be absent or
    null, and a client's body may hold anything)."""
    resp = response_of(ctx)
    used = (resp.usage or {}).get("completion_tokens")
    cap = ctx.max_tokens
    if not (isinstance(used, int) and isinstance(cap, int)) or isinstance(used, bool) or isinstance(cap, bool):
        return None
    return (used, cap) if used >= cap else None


def cut_at_cap(ctx: TurnContext) -> tuple[int, int] | None:
    """cap_reached, where the finish_reason does not say so: the turn was cut by the token cap
    whatever it claims. `"stop"` exactly at the cap under the request's own stop sequences is
    not: a stop string matched in the last allowed token ends the turn as `"stop"` on vLLM."""
    resp = response_of(ctx)
    reached = cap_reached(ctx)
    if reached is None or resp.finish_reason in ("length", None):
        return None
    used, cap = reached
    if resp.finish_reason == "stop" and used == cap and ctx.terms.stop:
        return None
    return reached


def check_finish_reason_mismatch(ctx: TurnContext) -> list[Verdict]:
    """finish_reason that contradicts the turn: anything but `"length"` from a turn that used
    all its `max_tokens` (usage says so), `"tool_calls"` without calls, `"stop"` with calls.

    An unrecognised finish_reason (e.g. `"abort"`, which SGLang sends for a request it
    aborted itself) is reported too: the client cannot act on it.
    """
    resp = response_of(ctx)
    reason, calls = resp.finish_reason, len(resp.tool_calls)
    if (cut := cut_at_cap(ctx)) is not None:
        # Checked first: a call cut at the cap parses often enough (a short argument, a cut
        # after the last brace) that only the token count tells the agent it is incomplete.
        used, cap = cut
        past = " (past it)" if used > cap else ""
        detail = f"completion_tokens {used} reached max_tokens {cap}{past} but finish_reason {reason!r}"
        return [Verdict("finish_reason_mismatch", detail, "finish_reason")]
    if reason == "tool_calls" and calls == 0:
        return [Verdict("finish_reason_mismatch", "finish_reason 'tool_calls' but no tool calls", "finish_reason")]
    if reason == "stop" and calls > 0:
        names = ", ".join(str(c.name) for c in resp.tool_calls)
        detail = f"finish_reason 'stop' with {calls} tool call(s): {names}"
        return [Verdict("finish_reason_mismatch", detail, "finish_reason")]
    if reason is not None and reason not in KNOWN_FINISH_REASONS:
        return [Verdict("finish_reason_mismatch", f"unexpected finish_reason {reason!r}", "finish_reason")]
    return []


def may_end_early(ctx: TurnContext) -> bool:
    """Whether the request itself allows its answer to end (`"stop"`) before any content: its own
    stop sequences (one may match in the reasoning or at the answer's first character, and the
    server never sends it), or an assistant message it prefilled and asked the model to continue
    (the answer's content is partly the client's own, and the continuation may end at once).
    tool_choice and the tools offered never do: "none" asks for an answer in text, not for none."""
    return bool(ctx.terms.stop) or ctx.terms.continues_assistant


def check_empty_turn(ctx: TurnContext) -> list[Verdict]:
    """Nothing at all: no content (after strip), no reasoning and no tool calls.

    A turn that only thought is `reasoning_only`'s. Turns cut short (finish_reason `"length"`
    or None) are `truncated`, not empty. A `"stop"` with nothing is no finding where the request
    allowed it to end there (may_end_early); a `"tool_calls"` with nothing always is: the calls
    it announces were dropped.
    """
    resp = response_of(ctx)
    if resp.finish_reason in ("length", None) or resp.content.strip() or resp.reasoning.strip() or resp.tool_calls:
        return []
    if resp.finish_reason == "stop" and may_end_early(ctx):
        return []
    detail = f"no content, no reasoning and no tool calls, finish_reason {resp.finish_reason!r}"
    return [Verdict("empty_turn", detail, "content")]


def check_stream_protocol(ctx: TurnContext) -> list[Verdict]:
    """Stream-protocol faults: one verdict per `protocol_errors` entry, plus duplicate call ids.

    The SSE assembler records the faults it sees (index gaps, missing id or name on a call's
    first delta; per call, a name sent again in a later delta, a second id at an index already
    used, a delta for an earlier index after a later one started; deltas after finish, no
    `[DONE]`, undecodable chunks, fields of the wrong type, and a response past one of the
    harness's bounds, which it stopped reading: a line, event, argument or text too long, too
    many tool calls); this checker maps them to verdicts. It adds one check of its own: two
    calls of one turn sharing an id (streamed or not), which breaks the agent's matching of
    tool results to calls.
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
    Nor is a turn cut at the cap whose finish_reason claims otherwise: finish_reason_mismatch
    owns that lie (one finding per fault; its detail says the cap cut it).
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
