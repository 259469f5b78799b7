"""Helpers shared by the checkers: the texts of a response, argument decoding, excerpts.

Pure functions over records; no checker logic lives here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from dsv4bench.history.records import AssembledResponse, TurnContext

EXCERPT_CHARS = 40  # characters of context on each side of a quoted match


def response_of(ctx: TurnContext) -> AssembledResponse:
    """The response of an OK turn; a missing one is a harness bug, so it raises."""
    if ctx.response is None:
        raise ValueError("turn has no response to check")
    return ctx.response


def excerpt(text: str, start: int, end: int | None = None, width: int = EXCERPT_CHARS) -> str:
    """A short `repr`-quoted slice of `text` around `[start, end)`, with `…` where cut."""
    end = start if end is None else end
    lo, hi = max(0, start - width), min(len(text), end + width)
    body = text[lo:hi]
    if end - start > 3 * width:  # a long match: keep its head and tail only
        body = text[lo : start + width] + "…" + text[end - width : hi]
    return ("…" if lo > 0 else "") + repr(body) + ("…" if hi < len(text) else "")


def clip(value: Any, limit: int = 120) -> str:
    """`repr`-free short rendering of any value for a verdict detail."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def first_difference(a: str, b: str) -> int:
    """The index of the first character where `a` and `b` differ (the shorter's length when one
    begins the other)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def decode_json(raw: str) -> Any:
    """`json.loads` that also rejects NaN / Infinity, which Python accepts and JSON does not.

    Raises ValueError for anything that is not JSON, nesting too deep to decode included
    (a `[[[[...` loop must be a verdict, not a checker crash).
    """
    try:
        return json.loads(raw, parse_constant=_reject_constant)
    except RecursionError as e:
        raise ValueError("nested too deep to decode") from e


def decode_object(raw: str) -> dict[str, Any] | None:
    """The arguments as a JSON object, or None when they are not one."""
    try:
        value = decode_json(raw)
    except (ValueError, TypeError):
        return None
    return value if isinstance(value, dict) else None


def string_leaves(value: Any, path: str = "$", *, keys: bool = False) -> Iterator[tuple[str, str]]:
    """Every string value inside a decoded JSON value, with its JSON path (`$.edits[0].new`);
    with `keys`, every object key too (path `$.edits[0].<key 'new'>`), text a model wrote as well."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            if keys:
                yield f"{path}.<key {key[:20]!r}>", key
            yield from string_leaves(item, f"{path}.{key}", keys=keys)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from string_leaves(item, f"{path}[{i}]", keys=keys)


def argument_texts(raw: str, *, as_sent: bool = True) -> Iterator[tuple[str, str]]:
    """(label, text) pairs to scan in one call's arguments: the whole, then each string value.

    Scanning decoded values sees through JSON escapes (`\\uff5c`, `\\u0000`, `\\n`) and past
    the closing `"}` of a string. The whole is the raw string as sent (label `"raw"`); with
    `as_sent=False` and arguments that decode, it is re-serialized without ASCII escapes
    (label `"json"`), so `\\u2500` sequences do not look like repetition. Raw text that
    does not decode is scanned alone. Values are labelled with their JSON path.
    """
    try:
        value = decode_json(raw)
    except (ValueError, TypeError):
        yield "raw", raw
        return
    yield ("raw", raw) if as_sent else ("json", json.dumps(value, ensure_ascii=False))
    yield from string_leaves(value)


def judged_texts(resp: AssembledResponse) -> Iterator[tuple[str, list[tuple[str, str]]]]:
    """Every text a turn produced, grouped by owner: `(where, [(label, text), ...])`.

    Owners are `content`, `reasoning` and each `tool_calls[i].arguments` (whose texts are
    `argument_texts(..., as_sent=False)`). A text checker reports at most one finding per owner.
    """
    yield "content", [("content", resp.content)]
    yield "reasoning", [("reasoning", resp.reasoning)]
    for i, call in enumerate(resp.tool_calls):
        yield f"tool_calls[{i}].arguments", list(argument_texts(call.arguments, as_sent=False))
