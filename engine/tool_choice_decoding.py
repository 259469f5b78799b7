"""Decoding that keeps an answer to its request's `tool_choice` and `parallel_tool_calls`, as a
server with constrained decoding does. deepseek-recipe only shapes the prompt (no tools rendered
for "none", an opened tool-call block for "required" and a named function, that function's
schema alone for a name); the model is free to write anything after it. Without this, the
shipped model under "none" writes tool-call markup anyway, which the parser then leaves in
`content` (SGLang's tool_choice-"none" leak), and under a named function it calls another tool
whenever the conversation points elsewhere.

- "none": the `｜DSML｜` token is masked at sampling, so no call can start.
- a named function: the call's opening `<｜DSML｜invoke name="NAME">` is forced as the first output
  tokens (the prompt has already opened the block).
- a named function, or `parallel_tool_calls: false`: once the first call closes, the block's close
  and EOS are forced, so the answer holds one call.

A constraint is a function of the request's output ids alone (`forced_next`), so the PD decode
half, which gets the first token from the prefill half, reaches the same decision as a unified
engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .tokenizer import DSV4Tokenizer

DSML = "｜DSML｜"
_INVOKE_OPEN = '<｜DSML｜invoke name="{name}">\n'
_INVOKE_CLOSE = "</｜DSML｜invoke>"
_BLOCK_CLOSE = "\n</｜DSML｜tool_calls>"
# Output tokens decoded to find the first call's close: the closing tag is a handful of tokens.
_TAIL_TOKENS = 12


@dataclass(frozen=True)
class ToolChoiceDecoding:
    """One request's constraint: ids masked at every sampling, forced output ids by position."""

    banned_ids: tuple[int, ...] = ()
    prefix_ids: tuple[int, ...] = ()  # the first output ids, forced
    close_ids: tuple[int, ...] = ()  # forced after the first call closes (empty: no limit on calls)
    tokenizer: DSV4Tokenizer | None = None

    def forced_next(self, output_ids: Sequence[int]) -> int | None:
        """The id the next output token must be, given the ids so far; None: the model's own."""
        n = len(output_ids)
        if n < len(self.prefix_ids):
            return self.prefix_ids[n]
        if not self.close_ids or self.tokenizer is None:
            return None
        closed_at = self._first_close(output_ids)
        if closed_at is None:
            return None
        done = n - closed_at
        return self.close_ids[done] if done < len(self.close_ids) else None

    def _first_close(self, output_ids: Sequence[int]) -> int | None:
        """How many output ids the first call's close took to appear, or None if it has not.
        Once it has appeared, the ids after it are the forced close, so its place is found again
        from the forced ids at the end rather than by decoding the whole output every step."""
        assert self.tokenizer is not None
        n, k = len(output_ids), len(self.close_ids)
        for done in range(min(k, n - len(self.prefix_ids)), -1, -1):
            # `done` ids of the close already forced: they must be exactly its first `done` ids.
            if tuple(output_ids[n - done :]) != self.close_ids[:done]:
                continue
            end = n - done
            tail = self.tokenizer.decode(output_ids[max(0, end - _TAIL_TOKENS) : end])
            if tail.rstrip().endswith(_INVOKE_CLOSE):  # `>` and a newline may be one token
                return end
        return None


def for_request(body: dict[str, Any], tokenizer: DSV4Tokenizer) -> ToolChoiceDecoding | None:
    """The constraint a chat body asks for, or None (auto, required without a limit on calls).
    The body has passed deepseek-recipe's conversion, which refuses a named choice in thinking mode."""
    tools = body.get("tools") or []
    choice = body.get("tool_choice")
    if not tools:
        return None
    if choice == "none":
        return ToolChoiceDecoding(banned_ids=(tokenizer.special_id(DSML),))
    named = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    one_call = named is not None or body.get("parallel_tool_calls") is False
    if not one_call:
        return None
    close = tuple(tokenizer.encode(_BLOCK_CLOSE)) + (tokenizer.eos_token_id,)
    prefix = tuple(tokenizer.encode(_INVOKE_OPEN.format(name=named))) if named is not None else ()
    return ToolChoiceDecoding(prefix_ids=prefix, close_ids=close, tokenizer=tokenizer)
