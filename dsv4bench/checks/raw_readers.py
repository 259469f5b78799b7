"""Readers of --raw completions for every model family the registry knows (dsv4bench.families).

A raw completion is read the way the family's reference front end reads it: DeepSeek-V4's by
deepseek-recipe (oracle.py), every other family's by SGLang's own detectors for it (its
`sglang_parsers[0]` tool-call parser after its `reasoning_parser`, sglang_oracle.py), whole or
streamed as the server answered, since SGLang reads the two through different code.

Which family's reader reads a turn:
- the server's family (`TurnContext.family`, from what the server reports), or the format of its
  group that the text is written in (Qwen's Hermes JSON or Qwen3-Coder XML; DeepSeek's versions);
- else every family whose `raw_signature` the text matches, the first (in the registry's order,
  so DSML is DeepSeek-V4's before V3.2's) whose reader found a call winning;
- else, a text with no family's markers (prose, a thought), the family the answer's model name
  says, else DeepSeek-V4's: no call to read, only where the thought ends.

A completion no reader can read (a family the registry does not know or cannot read, SGLang not
installed for a family only SGLang reads, a reader that raised) is "not read": the reading says
why and holds no response, so it is never a disagreement.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dsv4bench.checks.recipe_reader import parse_raw_completion
from dsv4bench.checks.sglang_oracle import read_with_sglang
from dsv4bench.families import BY_NAME, FAMILIES, Family, family_of_model
from dsv4bench.history.records import AssembledResponse, SglangReading

RECIPE_READER = "deepseek-recipe"
# The families deepseek-recipe reads first: its renderer writes their prompts (`renderer`).
RECIPE_FAMILIES = frozenset(f.name for f in FAMILIES if f.renderer == RECIPE_READER)
DEFAULT_FAMILY = "deepseek-v4"


@dataclass
class RawReading:
    """One raw completion read by its family's reference reader.

    `reader`: who made `oracle`, the reading the `parser_disagreement` code compares with the
    server's answer: "deepseek-recipe", or "SGLang <tool parser>" (then `oracle` is SGLang's
    reading made the way the server answered). `sglang`: SGLang's two readings with the family's
    detectors. `not_read`: why no reader could read the text (then `oracle` is None)."""

    family: str | None
    reader: str
    oracle: AssembledResponse | None
    sglang: SglangReading = field(default_factory=lambda: SglangReading("not read"))
    not_read: str | None = None


def _group(f: Family) -> str:
    return str(getattr(f, "group", None) or f.name)


def _marked(raw_text: str, families: tuple[Family, ...]) -> list[Family]:
    return [f for f in families if f.raw_signature is not None and f.raw_signature.search(raw_text)]


def families_for(raw_text: str, family: str | None, model: str | None = None) -> list[Family] | str:
    """The families whose readers to try on `raw_text`, best first, or why there are none.

    `family`: the server's (None: unknown); `model`: the answer's model name, for a text that
    carries no family's markers."""
    if family is not None:
        known = BY_NAME.get(family)
        if known is None:
            return f"no reader for model family {family!r} (known: {', '.join(BY_NAME)})"
        kin = tuple(f for f in FAMILIES if _group(f) == _group(known))
        marked = _marked(raw_text, kin)
        return [known, *(f for f in marked if f is not known)] if known in marked or not marked else marked
    marked = _marked(raw_text, FAMILIES)
    if marked:
        return marked
    return [BY_NAME.get(family_of_model(model) or DEFAULT_FAMILY) or BY_NAME[DEFAULT_FAMILY]]


def _read_as(f: Family, raw_text: str, body: dict[str, Any], finish_reason: str, stream: bool) -> RawReading:
    """`raw_text` read by family `f`'s reference reader (and SGLang's detectors for it)."""
    if not f.sglang_parsers and f.name not in RECIPE_FAMILIES:
        return RawReading(f.name, "not read", None, not_read=f"no reader for {f.name}: SGLang has no detector for it")
    sglang = (
        read_with_sglang(
            raw_text,
            body,
            finish_reason=finish_reason,
            tool_parser=f.sglang_parsers[0],
            reasoning_parser=f.reasoning_parser,
        )
        if f.sglang_parsers
        else SglangReading(f"SGLang has no detector for {f.name}")
    )
    if f.name in RECIPE_FAMILIES:
        try:
            recipe = parse_raw_completion(raw_text, body, finish_reason=finish_reason)
        except Exception as e:  # noqa: BLE001 - a reader that breaks leaves the text unread, never a crash
            return RawReading(f.name, "not read", None, sglang, f"deepseek-recipe raised {type(e).__name__}: {e}")
        return RawReading(f.name, RECIPE_READER, recipe, sglang)
    reading = sglang.stream if stream else sglang.whole
    if reading is None:  # SGLang not installed here, or its parser raised: the state says which
        return RawReading(f.name, "not read", None, sglang, f"{f.name} is read by SGLang's detectors: {sglang.state}")
    return RawReading(f.name, f"SGLang {f.sglang_parsers[0]}", reading, sglang)


def read_raw(
    raw_text: Any,
    body: dict[str, Any],
    *,
    family: str | None = None,
    model: str | None = None,
    finish_reason: str = "stop",
    stream: bool = False,
) -> RawReading:
    """`raw_text` as its family's reference reader reads it; never raises.

    `body`: the request it answers (oracle.body_for); `family`: the server's (None: found from the
    text's markers, see the module docstring); `model`: the answer's model name; `finish_reason`:
    the backend's; `stream`: whether the server answered streamed (which SGLang reading is the
    oracle's, for a family SGLang reads)."""
    if not isinstance(raw_text, str):
        return RawReading(
            family, "not read", None, not_read=f"the raw completion is not text ({type(raw_text).__name__})"
        )
    found = families_for(raw_text, family, model)
    if isinstance(found, str):
        return RawReading(family, "not read", None, not_read=found)
    readings = []
    for f in found:
        try:
            readings.append(_read_as(f, raw_text, body, finish_reason, stream))
        except Exception as e:  # noqa: BLE001 - a reader that breaks leaves the text unread, never a crash
            readings.append(
                RawReading(f.name, "not read", None, not_read=f"{f.name}'s reader raised {type(e).__name__}: {e}")
            )
    read = [r for r in readings if r.oracle is not None]
    if not read:
        return readings[0]
    # Where several formats' markers are there, the first (the server's family, else the
    # registry's order) whose reader found a call read it: the others left it as text.
    return next((r for r in read if r.oracle and r.oracle.tool_calls), read[0])
