"""Special-token leaks: any family's special tokens and thinking markers in the text a client
receives, judged with evidence by markup.py.

A correct server never sends a special token to the client: the detokenizer drops them
(`skip_special_tokens`), the reasoning parser consumes `<think>` / `</think>`, and the tool
parser consumes tool-call markup. When one shows up anyway, something on the way out broke:
speculative decoding streaming `<｜begin▁of▁sentence｜>` / `<｜end▁of▁sentence｜>` into content, a
reasoning parser that missed the end of thinking and left `</think>` in content, a role token
(`<｜User｜>`, `<|im_start|>`) written as the model ran on into a next turn, ChatML's
`<|im_end|>` or Llama's `<|eot_id|>` left at the end of an answer.

The tokens are the registry's (dsv4bench/families/): each family's, in every spelling seen in
the wild (`<|end_of_sentence|>` is DeepSeek's `<｜end▁of▁sentence｜>` with ASCII bars). The
server's family decides which are checked; an unknown family means all of them.

Where each finding belongs, so that no finding counts under two codes:
- tool-call markup (DSML, `<tool_call>`, `[TOOL_CALLS]`, Kimi's section tokens, harmony's
  `to=functions.NAME`) is the markup codes' (dsml_*, markup_*), not this one;
- the thinking markers count in content whatever the request's thinking flag; the flag, when
  known, is named in the detail;
- a token left as byte-level BPE bytes (`<ï½ľendâĸģofâĸģsentenceï½ľ>`) is undecoded text:
  `garbled_text`;
- a token the request itself gave the model (a user asking what `<|im_end|>` means, a file
  holding `<think>`) is text the task is about, never a leak (markup.py's rule 1).
"""

from __future__ import annotations


from dsv4bench.checks.markup import verdicts_of
from dsv4bench.families import find_markup
from dsv4bench.families.deepseek import TOKENS, bundled_tokens, recipe_tokens, special_tokens
from dsv4bench.history.records import TurnContext, Verdict

CODE = "special_token_leak"


def find_special_tokens(text: str, family: str | None = None) -> list[tuple[int, int, str]]:
    """Every special token (of `family`, or of every family) in `text`: (start, end, token)."""
    return [(m.start, m.end, m.text) for m in find_markup(text, family) if not m.tool_markup]


def check_special_token_leak(ctx: TurnContext) -> list[Verdict]:
    """A special token or thinking marker of the server's family (every family where it is not
    known) in content, reasoning or a call's arguments: at most one verdict per text, at its
    first token, naming how many more there are."""
    return verdicts_of(ctx, CODE)


__all__ = [
    "CODE",
    "TOKENS",
    "bundled_tokens",
    "check_special_token_leak",
    "find_special_tokens",
    "recipe_tokens",
    "special_tokens",
]
