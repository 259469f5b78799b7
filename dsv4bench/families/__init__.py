"""The registry of model families' tool-call and reasoning formats: one module per family, one
table of them (`FAMILIES`).

The leak checkers (dsv4bench/checks/markup.py) and the --raw oracle read it. The server's
family comes from what it reports: its tool-call parser setting (`/get_server_info`'s
`tool_call_parser`) first, else the served model's name; a family that cannot be told is
None, and then every family's markers are checked. A new family is one module here and one
entry in `_MODULES`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from dsv4bench.families import deepseek, gemma, glm, gpt_oss, kimi, llama, mistral, qwen
from dsv4bench.families.base import Family, Markup, resolve_overlaps

# Order matters where model names overlap: the most specific pattern first.
_MODULES = (deepseek, qwen, kimi, glm, gpt_oss, llama, mistral, gemma)
FAMILIES: tuple[Family, ...] = tuple(f for module in _MODULES for f in module.FAMILIES)
BY_NAME: dict[str, Family] = {f.name: f for f in FAMILIES}
assert len(BY_NAME) == len(FAMILIES), "each family name once"


def _parser_key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def family_of_parser(parser: str | None) -> str | None:
    """The family a tool-call parser setting names (SGLang's or vLLM's spelling), else None."""
    if not isinstance(parser, str) or not parser.strip():
        return None
    key = _parser_key(parser)
    for f in FAMILIES:
        if key in {_parser_key(p) for p in f.parsers}:
            return f.name
    return None


def family_of_model(model: str | None) -> str | None:
    """The family a served model's name says (`deepseek-ai/DeepSeek-V3.1` is deepseek-v3.1), else None."""
    if not isinstance(model, str) or not model.strip():
        return None
    for f in FAMILIES:
        if f.models.search(model):
            return f.name
    return None


def family_for(*, parser: str | None = None, models: Iterable[str | None] = ()) -> str | None:
    """The server's family from what it reports: its tool-call parser, else the first model name
    that names a family. None where nothing does: every family is then checked."""
    return family_of_parser(parser) or next((f for m in models if (f := family_of_model(m))), None)


AUTO, ALL = "auto", "all"  # --family: from what the server reports; every family whatever it reports


def family_flag(value: str) -> str:
    """A `--family` value checked: `auto`, `all`, a family name or a tool-call parser name (which
    names its family). ValueError, naming what is accepted, otherwise."""
    text = value.strip().lower()
    if text in (AUTO, ALL) or text in BY_NAME:
        return text
    named = family_of_parser(text)
    if named is None:
        raise ValueError(
            f"--family must be auto, all, or one of {', '.join(BY_NAME)} (or a tool-call parser "
            f"name such as qwen25, kimi_k2, glm45); got {value!r}"
        )
    return named


def chosen_family(flag: str, reported: str | None) -> str | None:
    """The family a run checks for: the flag's, else (auto) the server's; `all` checks every family."""
    if flag == AUTO:
        return reported
    return flag


def family_of_server(facts: dict) -> str | None:
    """The family a whole run is judged by, from what preflight read of the server: its tool-call
    parser setting (SGLang's `/get_server_info` `tool_call_parser`), which holds for every answer.
    Model names are no such fact (a gateway serves several families), so without a parser each
    turn's family comes from its own answer's `model` (turn_judge.request_context)."""
    info = v if isinstance(v := facts.get("server_info"), dict) else {}
    parser = info.get("tool_call_parser")
    return family_of_parser(parser if isinstance(parser, str) else None)


def families_to_check(family: str | None) -> tuple[Family, ...]:
    """The formats whose markers a turn is checked for: every format of the server's family
    (DeepSeek's versions, Qwen's two call styles: a server may write any of its family's), or
    all of them when the family is unknown."""
    if family is None or family not in BY_NAME:
        return FAMILIES
    group = BY_NAME[family].group
    return tuple(f for f in FAMILIES if f.group == group)


def find_markup(text: str, family: str | None = None, offered: Iterable[str] = ()) -> list[Markup]:
    """Every tool-call markup and special-token match of the families to check in `text`, in
    order, overlaps resolved (the earliest, then structural, then longest wins)."""
    if not text:
        return []
    names = frozenset(offered)
    found: list[Markup] = []
    seen: set[int] = set()  # formats of one family share markers: each runs once
    for f in families_to_check(family):
        found.extend(f.find(text, names, seen))
    return resolve_overlaps(found)


__all__ = [
    "ALL",
    "AUTO",
    "BY_NAME",
    "FAMILIES",
    "Family",
    "Markup",
    "chosen_family",
    "families_to_check",
    "family_flag",
    "family_for",
    "family_of_model",
    "family_of_parser",
    "family_of_server",
    "find_markup",
]
