"""The --raw oracle: DeepSeek's own renderer and parser (deepseek-recipe) as a reference, and the
`parser_disagreement` code over any family's reference reading (raw_readers.py).

With `--raw` the harness also fetches the model's raw completion text (special tokens
kept). `parse_raw_completion` parses it the way DeepSeek's reference front end would, and
`check_parser_disagreement` compares that with what the server sent: a difference means the
server's own tool parser (or its streaming) changed the model's answer on the way out.

The readers themselves: recipe_reader.py (deepseek-recipe, DeepSeek-V4) and raw_readers.py
(every family, SGLang's detectors).
"""

from __future__ import annotations

from typing import Any

from dsv4bench.checks.common import clip, decode_json, first_difference, response_of
from dsv4bench.checks.raw_readers import RawReading, read_raw
from dsv4bench.history.codes import ORACLE_CODE
from dsv4bench.history.records import AssembledResponse, TurnContext, Verdict

# The event a run writes where the raw oracle is not offered for a family on a server (no
# renderer for its prompt): harness/server_watch.py writes it, the report reads it.
NOT_OFFERED_EVENT = "raw_not_offered"


def body_for(ctx: TurnContext) -> dict[str, Any]:
    """A request body with the turn's tools, tool_choice and thinking flag, enough for the
    parser (TurnContext holds no transcript). An unknown thinking flag (None, as in audits)
    is left out, so `parse_raw_completion` infers it from the raw text."""
    body: dict[str, Any] = {
        "model": "DeepSeek-V4-Pro",
        "messages": [{"role": "user", "content": "."}],
        "tool_choice": ctx.terms.tool_choice_body(),
    }
    if ctx.thinking is not None:
        body["chat_template_kwargs"] = {"thinking": ctx.thinking}
    if ctx.tools:
        no_args = {"type": "object", "properties": {}}
        body["tools"] = [
            {"type": "function", "function": {"name": name, "parameters": schema or no_args}}
            for name, schema in ctx.tools.items()
        ]
    return body


def raw_finish(server: AssembledResponse) -> str:
    """The backend finish reason a turn's raw completion is parsed with: `length` where the
    server's answer was cut there, else `stop` (the raw request does not say)."""
    return "length" if server.finish_reason == "length" else "stop"


def json_equal(a: Any, b: Any) -> bool:
    """Equality of decoded JSON values: numbers by value (5 == 5.0), but true is not 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def arguments_agree(oracle: str, server: str) -> bool:
    """Two calls' arguments say the same: as decoded JSON (`json_equal`), else as text, stripped."""
    try:
        return json_equal(decode_json(oracle), decode_json(server))
    except (ValueError, TypeError):
        return oracle.strip() == server.strip()


def oracle_reading(ctx: TurnContext) -> RawReading | None:
    """The turn's raw completion read by its family's reference reader (raw_readers.read_raw),
    or None without one."""
    # Imported here: raw_readers reads with this module's deepseek-recipe parse.

    if ctx.raw_completion is None or ctx.response is None:
        return None
    server = ctx.response
    return read_raw(
        ctx.raw_completion,
        body_for(ctx),
        family=getattr(ctx, "family", None),
        model=server.model,
        finish_reason=raw_finish(server),
        stream=server.stream,
    )


def check_parser_disagreement(ctx: TurnContext) -> list[Verdict]:
    """The oracle's reading of `ctx.raw_completion` differs from what the server sent.

    The oracle is the turn's family's reference reader (raw_readers.py: deepseek-recipe for
    DeepSeek-V4, SGLang's detectors for the others). Compared: the sequence of tool call
    names; each call's arguments as decoded JSON (5 and 5.0 agree, key order does not matter;
    text that does not decode is compared stripped); content, stripped. One verdict per
    difference, saying what the oracle saw and what the server sent. Reasoning, ids and
    finish_reason are not compared. Returns [] when the turn has no raw completion, and when no
    reader could read it (the parser view says why: parser_view.py).
    """
    reading = oracle_reading(ctx)
    if reading is None or reading.oracle is None:
        return []
    server, oracle = response_of(ctx), reading.oracle
    verdicts = []
    o_names, s_names = [c.name for c in oracle.tool_calls], [c.name for c in server.tool_calls]
    if o_names != s_names:
        detail = f"tool call names: oracle saw {o_names}, server sent {s_names}"
        verdicts.append(Verdict(ORACLE_CODE, detail, "tool_calls"))
    for i, (o, s) in enumerate(zip(oracle.tool_calls, server.tool_calls)):
        if not arguments_agree(o.arguments, s.arguments):
            detail = f"{s.name} arguments: oracle saw {clip(o.arguments)!r}, server sent {clip(s.arguments)!r}"
            verdicts.append(Verdict(ORACLE_CODE, detail, f"tool_calls[{i}].arguments"))
    o_text, s_text = oracle.content.strip(), server.content.strip()
    if o_text != s_text:
        at = first_difference(o_text, s_text)
        k = max(0, at - 20)
        detail = f"content differs at {at}: oracle saw {clip(o_text[k:], 80)!r}, server sent {clip(s_text[k:], 80)!r}"
        verdicts.append(Verdict(ORACLE_CODE, detail, "content"))
    return verdicts
