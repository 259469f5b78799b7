"""The parsers' view of a --raw turn: the server's answer beside the raw completion's readings by
its family's readers (raw_readers.py): deepseek-recipe's, for DeepSeek-V4, and SGLang's with the
family's detectors (streamed and whole), field by field.

Evidence, never a verdict. Only the family's first reader against the server is a code
(`parser_disagreement`, oracle.py: deepseek-recipe, else SGLang's reading made the way the
server answered), and even that one is no verdict about the server. Here:
- SGLang against the server: the server's parser is not SGLang's detector for the family as it
  is installed here (another parser, version or setting), or its streaming changed the answer;
- deepseek-recipe against SGLang, or SGLang streamed against SGLang whole: a finding about the
  parsers, whatever the server sent.
Fields are compared as oracle.py compares them (the call names; each call's arguments as JSON,
else as text; the content, stripped), and the reasoning too, stripped.

A turn's readings are kept as records.OracleReadings: the family it was read as, the reader of
its oracle reading (deepseek-recipe's, kept in `recipe`, or `SGLang <tool parser>`, SGLang's
reading made the way the server answered), or, where no reader could read the text, `not_read`
saying why: evidence that the oracle could not judge the turn, never a disagreement.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

from dsv4bench.checks.common import clip
from dsv4bench.checks.oracle import arguments_agree, oracle_reading
from dsv4bench.checks.raw_readers import RECIPE_READER
from dsv4bench.checks.sglang_oracle import sglang_state
from dsv4bench.history.records import AssembledResponse, OracleReadings, TurnContext

SERVER, RECIPE, SGLANG_STREAM, SGLANG_WHOLE = "server", RECIPE_READER, "SGLang streamed", "SGLang whole"
NOT_READ = "not read"


def oracle_versions() -> dict[str, str]:
    """Which parsers read the raw completions: a run's record of its oracles. The first call
    imports SGLang (seconds), so a run makes it before its load starts."""
    return {"deepseek-recipe": f"deepseek-recipe {version('deepseek-recipe')}", "sglang": sglang_state()}


def read_oracles(ctx: TurnContext) -> OracleReadings | None:
    """The family's readers' readings of the turn's raw completion (never raises). None without
    one; where no reader could read it, readings with no reader and `not_read` saying why."""
    reading = oracle_reading(ctx)
    if reading is None:
        return None
    raw = ctx.raw_completion if isinstance(ctx.raw_completion, str) else repr(ctx.raw_completion)
    if reading.oracle is None:
        return OracleReadings(raw, None, reading.sglang, None, reading.family, reading.not_read or "no reader read it")
    recipe = reading.oracle if reading.reader == RECIPE_READER else None
    return OracleReadings(raw, recipe, reading.sglang, reading.reader, reading.family)


def not_read(oracles: OracleReadings) -> str | None:
    """Why no reader could read the turn's raw completion, or None where one did."""
    return oracles.not_read


def first_reader(oracles: OracleReadings) -> str:
    """Who made the reading the `parser_disagreement` code compares: deepseek-recipe, `SGLang
    <tool parser>` or `not read`."""
    return NOT_READ if oracles.not_read is not None or not oracles.reader else oracles.reader


def family_read_as(oracles: OracleReadings) -> str:
    """The family the turn's raw completion was read as, or "family not recorded" (a record
    from before the readings said it, or a text no family could be told for)."""
    return oracles.family or "family not recorded"


def kept_oracles(ctx: TurnContext) -> OracleReadings | None:
    """The readings a run keeps of a turn: where no reader could read it, or where they and the
    server's answer are not all one."""
    oracles = read_oracles(ctx)
    if oracles is None or ctx.response is None:
        return None
    return oracles if not_read(oracles) is not None or disagreements(ctx.response, oracles) else None


def readings(server: AssembledResponse, oracles: OracleReadings) -> dict[str, AssembledResponse]:
    """Every reading there is, by source, the server's first: deepseek-recipe's only where it
    read the turn (another family's first reading is SGLang's own, shown as such); the server's
    alone where nothing read it."""
    if not_read(oracles) is not None:
        return {SERVER: server}
    found = {
        SERVER: server,
        RECIPE: oracles.recipe,
        SGLANG_STREAM: oracles.sglang.stream,
        SGLANG_WHOLE: oracles.sglang.whole,
    }
    return {source: r for source, r in found.items() if r is not None}


def sglang_like(server: AssembledResponse) -> str:
    """SGLang's reading made the way the server answered: streamed or whole."""
    return SGLANG_STREAM if server.stream else SGLANG_WHOLE


def _fields(r: AssembledResponse, calls: int) -> dict[str, Any]:
    fields: dict[str, Any] = {"tool call names": [c.name for c in r.tool_calls]}
    for i in range(calls):
        fields[f"tool_calls[{i}].arguments"] = r.tool_calls[i].arguments if i < len(r.tool_calls) else None
    fields["content"], fields["reasoning"] = r.content.strip(), r.reasoning.strip()
    return fields


def _agree(where: str, a: Any, b: Any) -> bool:
    if where.endswith(".arguments") and isinstance(a, str) and isinstance(b, str):
        return arguments_agree(a, b)
    return bool(a == b)


@dataclass(frozen=True)
class Disagreement:
    """One field the readings do not agree on: the groups of sources that agree, each with its value."""

    where: str
    groups: tuple[tuple[tuple[str, ...], Any], ...]

    def apart(self, a: str, b: str) -> bool:
        """Sources `a` and `b` both read this field, differently."""
        of = {s: i for i, (sources, _) in enumerate(self.groups) for s in sources}
        return a in of and b in of and of[a] != of[b]

    def describe(self) -> str:
        """`content: server = SGLang streamed 'x'; deepseek-recipe 'y'` (no call: `-`)."""
        shown = [
            " = ".join(sources) + " " + ("-" if value is None else repr(clip(value, 80)))
            for sources, value in self.groups
        ]
        return f"{self.where}: " + "; ".join(shown)


def disagreements(server: AssembledResponse, oracles: OracleReadings) -> list[Disagreement]:
    """The fields on which the server's answer and the oracles' readings are not all one."""
    found = readings(server, oracles)
    calls = max(len(r.tool_calls) for r in found.values())
    fields = {source: _fields(r, calls) for source, r in found.items()}
    out = []
    for where in fields[SERVER]:
        groups: list[tuple[list[str], Any]] = []
        for source, values in fields.items():
            group = next((g for g in groups if _agree(where, g[1], values[where])), None)
            if group is None:
                groups.append(([source], values[where]))
            else:
                group[0].append(source)
        if len(groups) > 1:
            out.append(Disagreement(where, tuple((tuple(sources), value) for sources, value in groups)))
    return out
