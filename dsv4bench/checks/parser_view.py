"""The parsers' view of a --raw turn: the server's answer beside deepseek-recipe's reading and
SGLang's readings (streamed and whole) of the same raw completion, field by field.

Evidence, never a verdict. Only deepseek-recipe against the server is a code
(`parser_disagreement`, oracle.py), and even that one is no verdict about the server. Here:
- SGLang against the server: the server's parser is not SGLang's DeepSeek-V4 detector as it is
  installed here (another parser, version or setting), or its streaming changed the answer;
- deepseek-recipe against SGLang, or SGLang streamed against SGLang whole: a finding about the
  parsers, whatever the server sent.
Fields are compared as oracle.py compares them (the call names; each call's arguments as JSON,
else as text; the content, stripped), and the reasoning too, stripped.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

from dsv4bench.checks.common import clip
from dsv4bench.checks.oracle import arguments_agree, body_for, parse_raw_completion, raw_finish
from dsv4bench.checks.sglang_oracle import read_with_sglang, sglang_state
from dsv4bench.records import AssembledResponse, OracleReadings, TurnContext

SERVER, RECIPE, SGLANG_STREAM, SGLANG_WHOLE = "server", "deepseek-recipe", "SGLang streamed", "SGLang whole"


def oracle_versions() -> dict[str, str]:
    """Which parsers read the raw completions: a run's record of its oracles. The first call
    imports SGLang (seconds), so a run makes it before its load starts."""
    return {"deepseek-recipe": f"deepseek-recipe {version('deepseek-recipe')}", "sglang": sglang_state()}


def read_oracles(ctx: TurnContext) -> OracleReadings | None:
    """Both oracles' readings of the turn's raw completion. None without one, or where
    deepseek-recipe cannot read it: the `parser_disagreement` checker records that failure."""
    if ctx.raw_completion is None or ctx.response is None:
        return None
    body, finish = body_for(ctx), raw_finish(ctx.response)
    try:
        recipe = parse_raw_completion(ctx.raw_completion, body, finish_reason=finish)
    except Exception:  # noqa: BLE001 - reported once, as the checker's error
        return None
    return OracleReadings(ctx.raw_completion, recipe, read_with_sglang(ctx.raw_completion, body, finish_reason=finish))


def kept_oracles(ctx: TurnContext) -> OracleReadings | None:
    """The readings a run keeps of a turn: only where they and the server's answer are not all one."""
    oracles = read_oracles(ctx)
    return oracles if oracles is not None and ctx.response and disagreements(ctx.response, oracles) else None


def readings(server: AssembledResponse, oracles: OracleReadings) -> dict[str, AssembledResponse]:
    """Every reading there is, by source, the server's first."""
    found = {SERVER: server, RECIPE: oracles.recipe, SGLANG_STREAM: oracles.sglang.stream,
             SGLANG_WHOLE: oracles.sglang.whole}
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
        shown = [" = ".join(sources) + " " + ("-" if value is None else repr(clip(value, 80)))
                 for sources, value in self.groups]
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
