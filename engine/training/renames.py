"""Consistent renaming of a session's world names, so the model learns to copy names from its
context instead of recalling the few it saw in training.

The scenario worlds draw package, module, region, segment, service and team names from short
lists; a model trained on them alone learns the lists and guesses (`quarry/` where the project is
`fieldkit/`). Renaming every occurrence of such a name in one session's user, tool and assistant
text, to one fresh made-up word, keeps the session coherent (the world is just named
differently) while making a guess useless. System prompts and tool definitions are never
touched: tool names and schemas stay what the server offers.
"""

from __future__ import annotations

import random
import re
from typing import Any

from ...agents.coding_world import MODULES, PACKAGES
from ...agents.data_world import REGIONS, SEGMENTS
from ...agents.ops_world import SERVICES, TEAMS

POOLS: tuple[tuple[str, ...], ...] = (PACKAGES, MODULES, REGIONS, SEGMENTS, SERVICES, TEAMS)
_ONSETS = (
    "b",
    "br",
    "c",
    "d",
    "dr",
    "f",
    "g",
    "gl",
    "h",
    "k",
    "l",
    "m",
    "n",
    "p",
    "pr",
    "r",
    "s",
    "st",
    "t",
    "tr",
    "v",
    "w",
    "z",
)
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou")
_CODAS = ("", "", "n", "r", "l", "s", "x", "m", "nd", "rk")
_KNOWN = {name for pool in POOLS for name in pool}


def made_up_word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables))


def _fresh_like(name: str, rng: random.Random, taken: set[str]) -> str:
    """A made-up name shaped like `name`: same capitalisation and hyphenated parts."""
    while True:
        parts = [made_up_word(rng, rng.randint(1, 3)) for _ in name.split("-")]
        new = "-".join(parts)
        if name[:1].isupper():
            new = new.capitalize()
        if new not in taken and new not in _KNOWN:
            taken.add(new)
            return new


def rename_map(rng: random.Random, share: float = 0.7) -> dict[str, str]:
    """Old name -> new name for a random `share` of every pool's names."""
    taken: set[str] = set()
    return {name: _fresh_like(name, rng, taken) for pool in POOLS for name in pool if rng.random() < share}


def rename_entities(messages: list[dict[str, Any]], mapping: dict[str, str]) -> list[dict[str, Any]]:
    """The messages with every mapped name replaced where it stands as a name (not inside a
    longer word: `North` but not `Northern`; `_` and `-` count as separators)."""
    if not mapping:
        return messages
    names = sorted(mapping, key=len, reverse=True)  # longest first: `api-gateway` before `api`
    pattern = re.compile(r"(?<![A-Za-z0-9])(" + "|".join(map(re.escape, names)) + r")(?![A-Za-z0-9])")

    def sub(text: str) -> str:
        return pattern.sub(lambda m: mapping[m.group(1)], text)

    out = []
    for m in messages:
        m = dict(m)
        if m["role"] in ("user", "tool", "assistant") and isinstance(m.get("content"), str):
            m["content"] = sub(m["content"])
        if m.get("tool_calls"):
            m["tool_calls"] = [
                {**c, "function": {**c["function"], "arguments": sub(c["function"]["arguments"])}}
                for c in m["tool_calls"]
            ]
        out.append(m)
    return out
