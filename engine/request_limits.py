"""The edge every request body crosses before anything else reads it: size, nesting depth,
integer range, finite numbers, encodable strings; then per-field types and ranges.

Whatever a client sends, what passes here cannot raise in the front end or the engine loop,
and what does not pass is a `RequestError` (an OpenAI-style 4xx) whose `param` names the JSON
path at fault, e.g. `messages[0].content` or `seed`.

- Depth: counted on the raw bytes, brackets inside strings left out, before `json.loads` runs,
  so the parser never recurses deep (CPython's decoder recurses once per level, and a C stack
  is finite whatever the recursion limit says). deepseek-recipe refuses bodies nested deeper
  than 128; `MAX_DEPTH` stays well below, and far above any real tool schema.
- Numbers: integers outside the signed 64-bit range overflow in deepseek-recipe's conversion
  (serde) and in torch (a seed); `NaN`, `Infinity` and `1e400` are not JSON numbers a
  sampler can use.
- Strings: a lone surrogate (`"\\ud800"`) is valid JSON but not UTF-8; the tokenizer, the
  recipe and every JSON response that would echo it fail on it.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import numpy as np

MAX_DEPTH = 64  # arrays and objects, the body itself included
INT_MIN, INT_MAX = -(2**63), 2**63 - 1
_PATH_KEY_CHARS = 40  # a key longer than this is cut in `param`
_PATH_CHARS = 160  # and so is a path longer than this


class RequestError(Exception):
    """A request the server refuses: becomes an OpenAI-style error body with `status`."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.code = code or ("invalid_request_error" if status < 500 else "internal_error")

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


# ---- the body ---------------------------------------------------------------------------------


async def read_body(chunks: AsyncIterator[bytes], content_length: str | None, max_bytes: int) -> bytes:
    """The raw body, refused (413) beyond `max_bytes` whatever Content-Length claims."""
    if content_length is not None and (not content_length.isdigit() or int(content_length) > max_bytes):
        raise RequestError(413 if content_length.isdigit() else 400, "request body too large or bad Content-Length")
    data = bytearray()
    async for part in chunks:
        data += part
        if len(data) > max_bytes:
            raise RequestError(413, f"request body exceeds {max_bytes} bytes")
    return bytes(data)


def parse_json(raw: bytes, max_depth: int = MAX_DEPTH) -> Any:
    """Parse a request body and pass every value through `check_values`; RequestError (400)
    for anything the engine must not see."""
    if nesting_depth(raw, max_depth) > max_depth:
        field = deep_field(raw, max_depth)
        where = f"'{field}'" if field else "the JSON body"
        raise RequestError(400, f"{where} is nested deeper than {max_depth} levels", field, "nesting_too_deep")
    try:
        body = json.loads(raw)
    except RecursionError:  # unreachable after the depth check; kept as the last line of defence
        raise RequestError(
            400, f"the JSON body is nested deeper than {max_depth} levels", code="nesting_too_deep"
        ) from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer of over 4,300 digits
        raise RequestError(400, f"We could not parse the JSON body of your request: {_ascii(str(exc), 200)}") from None
    check_values(body, max_depth)
    return body


_QUOTE = ord('"')
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'[]{}"')
_STEP = np.zeros(256, dtype=np.int8)
_STEP[list(b"[{")] = 1
_STEP[list(b"]}")] = -1
_CHUNK = 1 << 20


def nesting_depth(raw: bytes, limit: int = MAX_DEPTH) -> int:
    """The deepest nesting of arrays and objects in `raw`, brackets inside strings left out.
    Stops counting once past `limit` (the result is then some value above it). Linear time
    whatever the bytes (no regular expression that could backtrack)."""
    opening = raw.count(b"[") + raw.count(b"{")
    if opening <= limit:
        return opening
    # NOTE: escapes first, leftmost pair first, as a JSON parser reads them: what is left of a
    # string is its quotes and escape-free text, so quote parity tells inside from outside.
    marks = raw.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURE)
    depth = deepest = quotes = 0
    for start in range(0, len(marks), _CHUNK):
        chunk = np.frombuffer(marks, dtype=np.uint8, count=min(_CHUNK, len(marks) - start), offset=start)
        inside = (np.cumsum(chunk == _QUOTE, dtype=np.int64) + quotes) & 1
        levels = np.cumsum(_STEP[chunk] * (inside == 0), dtype=np.int64) + depth
        quotes, depth = int(inside[-1]), int(levels[-1])
        deepest = max(deepest, int(levels.max()))
        if deepest > limit:
            break
    return deepest


def deep_field(raw: bytes, limit: int = MAX_DEPTH) -> str | None:
    """The top-level field of a JSON object body under which the nesting first goes past
    `limit` (for `param`), or None (not an object, or no such field). Only for a body that
    `nesting_depth` refused; it reads the bytes the same way, keeping their offsets."""
    # NOTE: same-length stand-ins for escape pairs keep every offset of `raw`.
    text = raw.replace(b"\\\\", b"..").replace(b'\\"', b"..")
    depth = quotes = 0
    member = -1  # where the value of the current top-level field opens (depth 2)
    for start in range(0, len(text), _CHUNK):
        chunk = np.frombuffer(text, dtype=np.uint8, count=min(_CHUNK, len(text) - start), offset=start)
        inside = (np.cumsum(chunk == _QUOTE, dtype=np.int64) + quotes) & 1
        steps = _STEP[chunk] * (inside == 0)
        levels = np.cumsum(steps, dtype=np.int64) + depth
        opens = np.flatnonzero((steps == 1) & (levels == 2))
        over = np.flatnonzero(levels > limit)
        if len(over):
            opens = opens[opens < over[0]]
        if len(opens):
            member = start + int(opens[-1])
        if len(over):
            break
        quotes, depth = int(inside[-1]), int(levels[-1])
    else:
        return None
    if member < 0 or not text.lstrip().startswith(b"{"):
        return None
    head = text[:member].rstrip()  # ... "key" :
    if not head.endswith(b":"):
        return None
    head = head[:-1].rstrip()
    opening = head.rfind(b'"', 0, len(head) - 1)
    if not head.endswith(b'"') or opening < 0:
        return None
    try:
        key = json.loads(raw[opening : len(head)])
    except ValueError:
        return None
    return _child("", key) if isinstance(key, str) and _encodable(key) else None


def check_values(body: Any, max_depth: int = MAX_DEPTH) -> None:
    """Walk a parsed body (iteratively) and refuse integers outside the signed 64-bit range,
    non-finite floats, strings that are not encodable as UTF-8 and nesting beyond `max_depth`,
    naming the offending path."""
    fault = _fault(body)
    if fault:
        raise RequestError(400, f"the body {fault}")
    stack: list[tuple[Any, str, int]] = [(body, "", 1)]
    while stack:
        value, path, depth = stack.pop()
        if type(value) is dict:
            items: Any = value.items()
        elif type(value) is list:
            items = enumerate(value)
        else:
            continue
        if depth > max_depth:
            raise RequestError(
                400,
                f"'{_cap(path) or 'body'}' is nested deeper than {max_depth} levels",
                _cap(path) or None,
                "nesting_too_deep",
            )
        for key, item in items:
            if type(key) is str and not _encodable(key):
                raise RequestError(
                    400, f"a key in '{_cap(path) or 'body'}' is not valid UTF-8 (a lone surrogate?)", _cap(path) or None
                )
            kind = type(item)
            if kind is dict or kind is list:
                stack.append((item, _child(path, key), depth + 1))
            elif fault := _fault(item):
                where = _cap(_child(path, key))
                raise RequestError(400, f"'{where}' {fault}", where)


def _fault(value: Any) -> str | None:
    """What is wrong with a scalar for the engine, or None."""
    kind = type(value)
    if kind is str:
        return None if _encodable(value) else "is not valid UTF-8 (a lone surrogate?)"
    if kind is int:
        return None if INT_MIN <= value <= INT_MAX else "is an integer outside the signed 64-bit range"
    if kind is float:
        return None if math.isfinite(value) else "must be a finite number"
    return None


def _child(path: str, key: Any) -> str:
    if type(key) is not str:
        return f"{path}[{key}]"
    key = key if len(key) <= _PATH_KEY_CHARS else key[:_PATH_KEY_CHARS] + "..."
    return f"{path}.{key}" if path else key


def _encodable(s: str) -> bool:
    if s.isascii():
        return True
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _cap(path: str) -> str:
    return path if len(path) <= _PATH_CHARS else path[:_PATH_CHARS] + "..."


def _ascii(text: str, limit: int) -> str:
    text = text.encode("ascii", "backslashreplace").decode("ascii")
    return text if len(text) <= limit else text[:limit] + "..."


# ---- the fields -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Field:
    """What one top-level field may hold: its types and, for numbers, its range."""

    types: tuple[type, ...]
    low: float | None = None
    high: float | None = None
    low_open: bool = False  # `low` itself is out of range

    def check(self, name: str, value: Any) -> None:
        if value is None:
            return
        if isinstance(value, bool) and bool not in self.types or not isinstance(value, self.types):
            names = " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in self.types)
            got = _TYPE_NAMES.get(type(value), type(value).__name__)
            raise RequestError(400, f"'{name}' must be of type {names}, got {got}", name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return
        too_low = self.low is not None and (value <= self.low if self.low_open else value < self.low)
        if too_low or self.high is not None and value > self.high:
            low = "-inf" if self.low is None else _num(self.low)
            high = "inf" if self.high is None else _num(self.high)
            bounds = f"{'(' if self.low_open else '['}{low}, {high}]"
            raise RequestError(400, f"'{name}' must be in {bounds}, got {_num(value)}", name)


_TYPE_NAMES = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    list: "array",
    dict: "object",
    type(None): "null",
}
NUMBER = (int, float)


def _num(x: float) -> str:
    return str(int(x)) if isinstance(x, int) or float(x).is_integer() and abs(x) < 2**63 else f"{x:g}"


def check_fields(body: dict[str, Any], fields: dict[str, Field]) -> None:
    """Check every field of `body` that `fields` describes (absent and null ones pass)."""
    for name, field in fields.items():
        field.check(name, body.get(name))
