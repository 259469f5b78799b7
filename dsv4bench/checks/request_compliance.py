"""What the request asked of the answer (dsv4bench/history/request_terms.py), checked: its tool_choice,
parallel_tool_calls and stop sequences, and a thinking turn that ends with nothing to act on.

DSML written into `content` under tool_choice "none" (the leak that only "none" shows, since the
server skips its tool parser then) is `dsml_leak_content`'s, as anywhere else; the report's split
by request variant shows where it happens. Schema-invalid arguments to a named function are
`schema_violation`'s; here a named function's answer is judged by which tools it called.
"""

from __future__ import annotations

from dsv4bench.checks.common import clip, excerpt, response_of
from dsv4bench.checks.protocol import cut_at_cap, may_end_early
from dsv4bench.history.records import TurnContext, Verdict
from dsv4bench.history.request_terms import NAMED


def check_tool_choice_violation(ctx: TurnContext) -> list[Verdict]:
    """ "none" with a tool call; "required" with none; a named function not called, or another
    tool called beside or instead of it. An answer cut by its length limit before any call is
    `truncated`'s, or finish_reason_mismatch's where it used all its max_tokens and says
    otherwise: the limit, not the tool_choice, ended it."""
    resp, terms = response_of(ctx), ctx.terms
    names = [c.name or "" for c in resp.tool_calls]
    choice = terms.tool_choice
    if not names and (resp.finish_reason in ("length", None) or cut_at_cap(ctx) is not None):
        return []
    if choice == "none" and names:
        return [
            Verdict(
                "tool_choice_violation",
                f"tool_choice 'none' but {len(names)} tool call(s): {clip(', '.join(names))}",
                "tool_calls",
            )
        ]
    if choice == "required" and not names:
        return [
            Verdict(
                "tool_choice_violation",
                f"tool_choice 'required' but no tool call (finish_reason {resp.finish_reason!r})",
                "tool_calls",
            )
        ]
    if choice == NAMED and terms.named_tool is not None:
        want = terms.named_tool
        if not names:
            return [
                Verdict(
                    "tool_choice_violation",
                    f"tool_choice names {want!r} but no tool call (finish_reason {resp.finish_reason!r})",
                    "tool_calls",
                )
            ]
        others = [(i, n) for i, n in enumerate(names) if n != want]
        if others:
            i, name = others[0]
            return [
                Verdict(
                    "tool_choice_violation",
                    f"tool_choice names {want!r} but the answer called "
                    f"{clip(name)!r}" + (f" and {len(others) - 1} other(s)" if len(others) > 1 else ""),
                    f"tool_calls[{i}].name",
                )
            ]
    return []


def check_parallel_calls_violation(ctx: TurnContext) -> list[Verdict]:
    """parallel_tool_calls false, yet more than one call in the turn."""
    resp = response_of(ctx)
    if ctx.terms.parallel_tool_calls is False and len(resp.tool_calls) > 1:
        return [
            Verdict(
                "parallel_calls_violation",
                f"parallel_tool_calls false but {len(resp.tool_calls)} tool calls in one turn",
                "tool_calls[1]",
            )
        ]
    return []


def check_stop_sequence_ignored(ctx: TurnContext) -> list[Verdict]:
    """A stop sequence of the request in the text sent: the server did not stop at it (SGLang cuts
    generation at the first match and never sends the sequence itself)."""
    resp = response_of(ctx)
    for where, text in (("content", resp.content), ("reasoning", resp.reasoning)):
        for stop in ctx.terms.stop:
            at = text.find(stop)
            if at >= 0:
                return [
                    Verdict(
                        "stop_sequence_ignored",
                        f"stop sequence {stop!r} in {where}: {excerpt(text, at, at + len(stop))}",
                        where,
                    )
                ]
    return []


def check_reasoning_only(ctx: TurnContext) -> list[Verdict]:
    """A thinking turn that finished (`stop`) with reasoning but no content and no tool call: the
    agent has nothing to act on (deep reasoning_effort tiers that end inside their thinking).

    Only where the request allowed no such end. It did where its own stop sequences may have
    ended the answer inside the reasoning (the server cuts at the match and never sends it), or
    where it continues an assistant message it prefilled (protocol.may_end_early). A turn that
    used all its max_tokens and still says `stop` was cut, not finished: finish_reason_mismatch
    owns that. tool_choice "none", or no tools offered, allows nothing here: the answer is then
    owed in text.
    """
    resp = response_of(ctx)
    if not (
        resp.finish_reason == "stop" and resp.reasoning.strip() and not resp.content.strip() and not resp.tool_calls
    ):
        return []
    if may_end_early(ctx) or cut_at_cap(ctx) is not None:
        return []
    effort = ctx.terms.reasoning_effort
    return [
        Verdict(
            "reasoning_only",
            f"{len(resp.reasoning)} characters of reasoning, then nothing"
            + (f" (reasoning_effort {effort!r})" if effort else ""),
            "content",
        )
    ]
