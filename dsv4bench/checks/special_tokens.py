"""Special-token leaks: DSV4's special tokens and thinking markers in the text a client receives.

A correct server never sends a special token to the client: the detokenizer drops them
(`skip_special_tokens`), the reasoning parser consumes `<think>` / `</think>`, and the tool
parser consumes DSML. When one shows up anyway, something on the way out broke: speculative
decoding streaming `<｜begin▁of▁sentence｜>` / `<｜end▁of▁sentence｜>` into content, a reasoning
parser that missed the end of thinking and left `</think>` (and the reasoning before it) in
content, a role token (`<｜User｜>`, `<｜Assistant｜>`) written into the reasoning as the model
ran on into a next turn, a token pasted into a tool call's arguments.

The tokens are not listed here. They are the union of two definitions, read once at import:
- deepseek-recipe: every `deepseek_recipe.SpecialToken` kind, spelled by the default
  `SpecialTokens` mapping (the spellings DeepSeek's own renderer and parser use);
- the bundled tokenizer: the added tokens marked special in the engine's
  `assets/tokenizer.json` (the vocabulary the bundled engine serves with).
Either alone is enough when the other is not installed; today both hold the same 18 tokens.

Where each finding belongs, so that no finding counts under two codes:
- `｜DSML｜` is a special token too, but DSML markup is the DSML codes' finding (dsml.py, with
  every variant spelling); it is left out here.
- The thinking markers count in content whatever the request's thinking flag: with thinking
  off the prompt itself closed the thinking (`<｜Assistant｜></think>`), with thinking on the
  reasoning parser should have consumed them; the flag, when known, is named in the detail.
  The verdict does not depend on it, so `audit`, which does not know the flag, agrees with
  the live run.
- Only the decoded spellings, exactly, are matched. A token left as byte-level BPE bytes
  (`<ï½ľendâĸģofâĸģsentenceï½ľ>`) is undecoded text: `garbled_text`. Look-alikes of other
  spellings (`<|end_of_sentence|>`, `<thinking>`, `think`, a lone `｜` in Chinese prose,
  prose about "DSML") are not DSV4 tokens and stay clean.
- A token quoted in prose (`` `<｜end▁of▁sentence｜>` ``) is still a leak: the text a server
  sends is the model's tokens detokenized, and a correct detokenizer drops special ones.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

from dsv4bench.checks.common import excerpt, judged_texts, response_of
from dsv4bench.records import TurnContext, Verdict

CODE = "special_token_leak"
THINKING_KINDS = ("ThinkingStart", "ThinkingEnd")


def recipe_tokens() -> dict[str, str]:
    """deepseek-recipe's special tokens, spelling -> kind name (`Eos`); {} when it is not installed."""
    try:
        import deepseek_recipe as dr
    except ImportError:
        return {}
    spelling = dr.SpecialTokens()
    kinds = {name: kind for name in dir(dr.SpecialToken)
             if isinstance(kind := getattr(dr.SpecialToken, name), dr.SpecialToken)}
    return {spelling.token(kind): name for name, kind in sorted(kinds.items())}


def _bundled_tokenizer_path() -> Path | None:
    """Where the bundled engine's tokenizer.json lies, found without importing the engine."""
    spec = importlib.util.find_spec("dsv4bench.engine")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "assets" / "tokenizer.json"
        if path.is_file():
            return path
    return None


def bundled_tokens(path: Path | None = None) -> dict[str, str]:
    """The bundled tokenizer's special added tokens, spelling -> `added token <id>`; {} when absent."""
    path = path or _bundled_tokenizer_path()
    if path is None:
        return {}
    added = json.loads(path.read_text(encoding="utf-8")).get("added_tokens") or []
    return {t["content"]: f"added token {t['id']}" for t in added if t.get("special") and t.get("content")}


def special_tokens() -> dict[str, str]:
    """Every DSV4 special token, spelling -> name: the union of both sources, deepseek-recipe's
    kind names winning where both name a token."""
    tokens = {**bundled_tokens(), **recipe_tokens()}
    if not tokens:
        raise RuntimeError("no DSV4 special-token definition found (deepseek-recipe or the bundled tokenizer)")
    return tokens


def _judged(tokens: dict[str, str]) -> dict[str, str]:
    """The tokens this code judges: all but the DSML marker, which dsml.py owns."""
    return {s: name for s, name in tokens.items() if name != "Dsml" and "DSML" not in s}


TOKENS: dict[str, str] = _judged(special_tokens())
# By kind where deepseek-recipe names them; by spelling where only the tokenizer's ids are known.
THINKING_MARKERS = frozenset(s for s, name in TOKENS.items() if name in THINKING_KINDS or "think" in s)
# One alternation of literals, longest first, so no token is matched by a shorter one's prefix.
_TOKEN_RX = re.compile("|".join(re.escape(s) for s in sorted(TOKENS, key=len, reverse=True)))


def find_special_tokens(text: str) -> list[re.Match[str]]:
    """Every DSV4 special token (the DSML marker aside) in `text`, in order."""
    return list(_TOKEN_RX.finditer(text)) if text else []


def _thinking_note(ctx: TurnContext, where: str, token: str) -> str:
    if token not in THINKING_MARKERS or where != "content" or ctx.thinking is None:
        return ""
    if ctx.thinking:
        return " (thinking on: the reasoning parser missed it)"
    return " (thinking off: the prompt had already closed the thinking)"


def check_special_token_leak(ctx: TurnContext) -> list[Verdict]:
    """A DSV4 special token or thinking marker in content, reasoning or a call's arguments:
    at most one verdict per text, at its first token, naming how many more there are.

    Arguments are judged as a whole (re-serialized without ASCII escapes when they decode, so a
    `\\uff5c` escape is seen as the bar) and per string value (so `<\\/think>` is seen as
    `</think>`)."""
    verdicts = []
    for where, texts in judged_texts(response_of(ctx)):
        for label, text in texts:
            found = find_special_tokens(text)
            if not found:
                continue
            first = found[0]
            token = first.group()
            more = f" (+{len(found) - 1} more)" if len(found) > 1 else ""
            prefix = "" if label in ("raw", "json", where) else f"in {label}: "
            detail = (f"{prefix}{TOKENS[token]} {token!r}{_thinking_note(ctx, where, token)}{more} at "
                      f"{first.start()}: {excerpt(text, first.start(), first.end())}")
            verdicts.append(Verdict(CODE, detail, f"{where}@{first.start()}" if label == where else where))
            break
    return verdicts
