"""Plain records shared by the session core, the checkers, the history and the report.

Everything here is data: no I/O, no policy. A turn record written to `turns.jsonl` is
`TurnRecord.to_json()`; reading it back is `TurnRecord.from_json()`.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any

# The verdict codes' family views, kept importable from here; their one table is codes.py.
from dsv4bench.history.codes import (
    AVAILABILITY_CODES as AVAILABILITY_CODES,
    CORRUPTION_CODES as CORRUPTION_CODES,
    ORACLE_CODE as ORACLE_CODE,
    REFERENCE_CODE as REFERENCE_CODE,
    WEDGE_CODES as WEDGE_CODES,
)
from dsv4bench.history.request_terms import RequestTerms


class TurnStatus(str, enum.Enum):
    """How a turn ended, from the client's side (Jepsen's ok / info / fail)."""

    OK = "ok"  # a complete response arrived; checkers judge it
    KILLED = "killed"  # our own nemesis cancelled it: indeterminate, never corruption
    ERROR = "error"  # HTTP error or connection failure
    TIMEOUT = "timeout"  # TTFT or total timeout


class ErrorKind(str, enum.Enum):
    """The client's own label for a turn that failed; its value is what `turns.jsonl` holds."""

    HTTP_ERROR = "http_error"
    CONNECTION_ERROR = "connection_error"
    TIMEOUT_TTFT = "timeout_ttft"
    TIMEOUT_TOTAL = "timeout_total"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def read(cls, value: str | None) -> ErrorKind | str | None:
        """A label read from a history: its member, or a string no member has, kept as it is."""
        try:
            return None if value is None else cls(value)
        except ValueError:
            return value


def error_kind_text(kind: ErrorKind | str | None) -> str | None:
    """The label as a history writes it: a member's value, an unknown string as it is."""
    return kind.value if isinstance(kind, ErrorKind) else kind


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


INT64 = 2**63  # the stamps of a nanosecond clock, and a turn index, fit a signed 64-bit integer


def is_finite_number(value: Any) -> bool:
    """A number as JSON read it that a file can hold again: not a bool, not NaN or infinite."""
    return type(value) in (int, float) and math.isfinite(value)


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _conforms(value: Any, hint: Any) -> bool:
    """Whether a value read from JSON fits a field's annotation. A nested record or an enum only
    needs its JSON shape here (an object, a string): its own from_json reads the rest. A float
    must be finite (json reads NaN and Infinity); an int is never a bool."""
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    args = typing.get_args(hint)
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        return any(_conforms(value, a) for a in args)
    if origin is list:
        return type(value) is list and all(_conforms(v, args[0]) for v in value)
    if origin is dict or dataclasses.is_dataclass(hint):
        return type(value) is dict
    if hint is float:
        return is_finite_number(value)
    if hint in (int, bool):
        return type(value) is hint
    return isinstance(value, str)  # str, and the str enums (TurnStatus, ErrorKind)


def _checked(cls: type, d: Any) -> dict[str, Any]:
    """The fields of `cls` that the JSON object `d` holds; ValueError naming the first one whose
    value is not of its annotated type, so that a hand-edited or damaged record is counted as
    unreadable instead of failing wherever its value is first used."""
    if type(d) is not dict:
        raise ValueError(f"{cls.__name__}: {type(d).__name__}, not an object")
    hints = _field_types(cls)
    for k, v in d.items():
        if k in hints and not _conforms(v, hints[k]):
            raise ValueError(f"{cls.__name__}.{k}: {type(v).__name__} {str(v)[:40]!r} is not {hints[k]}")
    return {k: v for k, v in d.items() if k in hints}


def _as_dict(obj: Any) -> dict[str, Any]:
    """A flat dataclass's fields as a dict, each list or dict copied one level: what
    `dataclasses.asdict` gives for these records, at a tenth of its cost per turn."""
    out = {}
    cls: type = type(obj)  # as `type`, hashable to mypy (the cache's key); type(Any) is not
    for name in _field_names(cls):
        v = getattr(obj, name)
        out[name] = list(v) if type(v) is list else dict(v) if type(v) is dict else v
    return out


@dataclass(frozen=True)
class Verdict:
    """One finding about one turn. `where` points into the response, e.g. `tool_calls[0].arguments`."""

    code: str
    detail: str
    where: str = ""

    def to_json(self) -> dict[str, Any]:
        return _as_dict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Verdict:
        return cls(**_checked(cls, d))


@dataclass
class ToolCall:
    """A tool call as the server sent it. `arguments` is the raw string, never parsed here."""

    index: int
    id: str | None
    name: str | None
    arguments: str = ""

    def to_json(self) -> dict[str, Any]:
        return _as_dict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ToolCall:
        d = _checked(cls, {"id": None, "name": None, **d, "arguments": d.get("arguments") or ""})
        return cls(**d)


@dataclass
class AssembledResponse:
    """One assistant turn as assembled from SSE deltas (or read from a non-stream body).

    `protocol_errors` are the stream-protocol faults the assembler saw on the way
    (index gaps, missing id/name on a call's first delta, deltas after finish, no `[DONE]`,
    undecodable chunks). `saw_done` is False for a stream that ended without `[DONE]`.
    `stopped_at_bound` names the harness bound (stream_reader.StreamBounds) past which it stopped reading
    this response; None when it was read to its end. `surrogates_replaced` lists the texts
    (`content`, `reasoning`, `tool_calls[<index>].arguments`) in which lone UTF-16 surrogates
    were replaced by U+FFFD on the way in.
    """

    response_id: str | None = None
    model: str | None = None
    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    stream: bool = True
    saw_done: bool = False
    chunks: int = 0
    protocol_errors: list[str] = field(default_factory=list)
    stopped_at_bound: str | None = None
    surrogates_replaced: list[str] = field(default_factory=list)
    # SGLang's split of the cached prompt tokens by tier ({"device": D, "host": H}), from the
    # answer's `sglext` where the request asked for it; None where none came.
    cached_tokens_details: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        d = _as_dict(self)
        d["tool_calls"] = [tc.to_json() for tc in self.tool_calls]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> AssembledResponse:
        d = _checked(cls, d)
        d["tool_calls"] = [ToolCall.from_json(t) for t in d.get("tool_calls") or []]
        return cls(**d)


@dataclass
class SglangReading:
    """SGLang's DeepSeek-V4 parsers' reading of a raw completion (checks/sglang_oracle.py), as
    SGLang would answer it streamed (`stream`) and whole (`whole`): two code paths of its own.
    Both None where there is no reading, `state` saying why; else `state` names the version.
    `log`: what SGLang's parsers logged on the way (why it dropped a call, say)."""

    state: str
    stream: AssembledResponse | None = None
    whole: AssembledResponse | None = None
    log: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "stream": self.stream.to_json() if self.stream else None,
            "whole": self.whole.to_json() if self.whole else None,
            "log": self.log,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SglangReading:
        stream, whole = (AssembledResponse.from_json(d[k]) if d.get(k) else None for k in ("stream", "whole"))
        return cls(state=str(d.get("state") or ""), stream=stream, whole=whole, log=list(d.get("log") or []))


@dataclass
class OracleReadings:
    """The --raw oracle's readings of one turn's raw completion, set beside the server's own
    answer by checks/parser_view.py (checks/raw_readers.py reads it).

    `family`: the model family the text was read as (None: not recorded, or no family could be
    told). `reader`: who made the oracle reading, the one `parser_disagreement` compares:
    "deepseek-recipe" (its reading is `recipe`), or "SGLang <tool parser>" (the oracle reading
    is `sglang`'s, made the way the server answered: streamed or whole), or None where nothing
    read the text; then `not_read` says why, and the turn is evidence that the oracle could not
    judge it, never a disagreement. `recipe`: deepseek-recipe's reading, where it read the text.
    `sglang`: SGLang's readings with the family's detectors, streamed and whole."""

    raw_completion: str
    recipe: AssembledResponse | None = None
    sglang: SglangReading = field(default_factory=lambda: SglangReading("not read"))
    reader: str | None = None
    family: str | None = None
    not_read: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "raw_completion": self.raw_completion,
            "family": self.family,
            "reader": self.reader,
            "not_read": self.not_read,
            "recipe": self.recipe.to_json() if self.recipe else None,
            "sglang": self.sglang.to_json(),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> OracleReadings:
        raw = str(d.get("raw_completion") or "")
        recipe = AssembledResponse.from_json(d["recipe"]) if d.get("recipe") else None
        sglang = SglangReading.from_json(d.get("sglang") or {})
        if "reader" in d:
            text = {k: d[k] if isinstance(d.get(k), str) else None for k in ("reader", "family", "not_read")}
            if text["reader"] is None and text["not_read"] is None:  # damaged: no reader, and no word why
                text["not_read"] = "the record names no reader"
            return cls(raw, recipe, sglang, **text)
        return cls._from_old_json(raw, recipe, sglang)

    @classmethod
    def _from_old_json(cls, raw: str, recipe: AssembledResponse | None, sglang: SglangReading) -> OracleReadings:
        """A record written before OracleReadings said its reader: `recipe` and `sglang` only,
        the family never recorded. Before other families were read, `recipe` was always
        deepseek-recipe's (its `model` the served model's name); for a while after, its `model`
        named the reader where that was not deepseek-recipe (`SGLang <tool parser>`, a copy of
        SGLang's reading), or was "not read", with `sglang.state` "not read: <why>"."""
        model = recipe.model if recipe is not None else None
        if model == "not read" and sglang.state.startswith("not read: "):
            return cls(raw, None, sglang, None, None, sglang.state.removeprefix("not read: "))
        if isinstance(model, str) and model.startswith("SGLang "):
            return cls(raw, None, sglang, model)
        if recipe is None:  # a damaged record: say so rather than pass it off as read
            return cls(raw, None, sglang, None, None, "the record kept no reading")
        return cls(raw, recipe, sglang, "deepseek-recipe")


@dataclass
class Timings:
    """Wall-clock (epoch ns) and monotonic (ns) stamps of one turn. None where not reached."""

    start_wall_ns: int = 0
    start_ns: int = 0
    first_byte_ns: int | None = None
    first_token_ns: int | None = None
    end_ns: int | None = None
    # Monotonic stamps of each content/reasoning/argument delta after the first, for ITL.
    token_gaps_ms: list[float] = field(default_factory=list)
    # How long the harness's own event loop stood still while the turn was in flight
    # (loop/lag_clock.py): stamps inside that stretch may be late by up to this much. Its deadlines
    # did not count it.
    harness_stall_ms: float = 0.0

    @property
    def ttft_s(self) -> float | None:
        if self.first_token_ns is None:
            return None
        return (self.first_token_ns - self.start_ns) / 1e9

    @property
    def e2e_s(self) -> float | None:
        if self.end_ns is None:
            return None
        return (self.end_ns - self.start_ns) / 1e9

    def to_json(self) -> dict[str, Any]:
        return _as_dict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Timings:
        """Read back; ValueError for stamps no clock gives (past 64 bits). A stage stamped a
        little before the turn's start is read as it is: an arrival stamp is the kernel's, moved
        onto the monotonic clock (transport.py), and a wall clock stepped meanwhile moves it."""
        t = cls(**_checked(cls, d))
        stamps = (t.start_wall_ns, t.start_ns, t.first_byte_ns, t.first_token_ns, t.end_ns)
        if any(s is not None and not -INT64 < s < INT64 for s in stamps):
            raise ValueError("Timings: a stamp past 64 bits")
        return t


@dataclass(frozen=True)
class ReferenceAnswer:
    """What a reference run's server wrote for a request (dsv4bench/harness/reference_run.py), and where."""

    content: str
    reasoning: str
    tool_calls: tuple[tuple[str, str], ...]  # (name, arguments); call ids are the server's own
    finish_reason: str | None
    session: str = ""
    turn: int | None = None

    @property
    def output(self) -> tuple[Any, ...]:
        return (self.content, self.reasoning, self.tool_calls, self.finish_reason)

    @classmethod
    def of(cls, response: AssembledResponse, **where: Any) -> ReferenceAnswer:
        calls = tuple((c.name or "", c.arguments) for c in response.tool_calls)
        return cls(response.content, response.reasoning, calls, response.finish_reason, **where)

    @classmethod
    def from_response_json(cls, d: dict[str, Any], **where: Any) -> ReferenceAnswer:
        return cls.of(AssembledResponse.from_json(d), **where)


class GivenText:
    """The text a request gave the model: its system, developer, user and tool-result messages.

    Markup found there is text the task is about, not a leak, unless the model wrote it first:
    the assistant's own earlier turns (content and call arguments) come before, in order, so a
    token the model leaked into a call's arguments and the tool echoed back in its result is
    still the model's, and its next leak of it still a leak. (A server renders earlier calls as
    markup; that rendering is never here.) Joined once, on first use.
    """

    _ROLES = ("system", "developer", "user", "tool", "function")

    def __init__(self, texts: tuple[str, ...] = (), messages: list[Any] | None = None) -> None:
        # Read lazily (`written`): a turn's request is walked only where markup was found, so the
        # whole conversation, every earlier call's arguments decoded, stays off the per-turn path.
        self._texts = texts
        self._messages = messages

    @classmethod
    def of_body(cls, body: Any) -> GivenText | None:
        """What `body` (a chat request) gave the model; None where it holds no messages to read."""
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(messages, list):
            return None
        return cls(messages=list(messages))  # the list as sent: a session appends to its own later

    @functools.cached_property
    def written(self) -> tuple[tuple[bool, str], ...]:
        """(given, text) in conversation order: given by the request (True) or written by the model."""
        if self._messages is None:
            return tuple((True, t) for t in self._texts)
        written: list[tuple[bool, str]] = []
        for msg in self._messages:
            if not isinstance(msg, dict):
                continue
            if msg.get("role") in self._ROLES:
                written.extend((True, t) for t in _message_texts(msg.get("content")))
            elif msg.get("role") == "assistant":
                written.extend((False, t) for t in _assistant_texts(msg))
        return tuple(written)

    @functools.cached_property
    def joined(self) -> str:
        return "\x00".join(t for _, t in self.written)

    def holds(self, text: str) -> bool:
        """Whether `text` appears, exactly, in what the request gave the model before the model
        itself ever wrote it."""
        if not text or text not in self.joined:
            return False
        return next((given for given, t in self.written if text in t), False)


def _assistant_texts(msg: dict[str, Any]) -> list[str]:
    """An earlier assistant turn's text: its content, reasoning, and its calls' arguments, as sent
    and decoded (a token written as `\\uff5c` escapes is the token)."""
    texts = _message_texts(msg.get("content"))
    for key in ("reasoning_content", "reasoning"):
        if isinstance(msg.get(key), str):
            texts.append(msg[key])
    calls = msg.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        fn = call.get("function") if isinstance(call, dict) else None
        args = fn.get("arguments") if isinstance(fn, dict) else None
        if isinstance(args, str):
            texts.append(args)
            try:
                texts.append(json.dumps(json.loads(args), ensure_ascii=False))
            except (ValueError, RecursionError):
                pass
        elif args is not None:
            texts.append(json.dumps(args, ensure_ascii=False, default=str))
    return texts


def _message_texts(content: Any) -> list[str]:
    """A message's text: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
    return []


@dataclass
class TurnContext:
    """What the checkers see of one turn: the response plus what the request allowed.

    `tools` maps each offered tool name to its JSON Schema (`parameters`). For ERROR and
    TIMEOUT turns `error_kind` (the client's own label) decides the availability code;
    `http_status` is a fallback only (a stream cut after a 200 status is a connection error).
    """

    response: AssembledResponse | None
    tools: dict[str, dict[str, Any]]
    status: TurnStatus = TurnStatus.OK
    http_status: int | None = None
    error: str | None = None
    error_kind: ErrorKind | str | None = None  # a str: read from a history that has no such member
    stream: bool = True
    max_tokens: int | None = None
    thinking: bool | None = None  # the request's thinking flag; None when not known (audit)
    terms: RequestTerms = field(default_factory=RequestTerms)  # tool_choice, parallel calls, stop
    raw_completion: str | None = None  # the --raw oracle's completion text, when fetched
    reference: ReferenceAnswer | None = None  # --reference: that run's answer to this same request
    # What the request gave the model (GivenText.of_body); None where it is not known (an audit
    # of answers without their requests): markup that is not structural is then only evidence.
    given: GivenText | None = None
    family: str | None = None  # the server's model family (dsv4bench.families); None: check every family


@dataclass
class TurnRecord:
    """One line of `turns.jsonl`: one agent turn (history/run_folder.py lays out the whole run folder)."""

    run: str
    session: str
    turn: int
    scenario: str
    seed: int
    status: TurnStatus
    timings: Timings
    http_status: int | None = None
    error: str | None = None
    error_kind: ErrorKind | str | None = None  # a str: read from a history that has no such member
    request: dict[str, Any] = field(default_factory=dict)  # summary, not the full body
    response: AssembledResponse | None = None
    verdicts: list[Verdict] = field(default_factory=list)
    raw_sse: list[str] | None = None  # kept only for turns that fail a check
    check_errors: list[str] = field(default_factory=list)  # a checker that raised: "unknown"
    oracles: OracleReadings | None = None  # --raw: kept only where the parsers' readings disagree

    @property
    def response_id(self) -> str | None:
        return self.response.response_id if self.response else None

    @property
    def corrupt(self) -> bool:
        return self.status is TurnStatus.OK and any(v.code in CORRUPTION_CODES for v in self.verdicts)

    def to_json(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "session": self.session,
            "turn": self.turn,
            "scenario": self.scenario,
            "seed": self.seed,
            "status": self.status.value,
            "http_status": self.http_status,
            "error": self.error,
            "error_kind": error_kind_text(self.error_kind),
            "response_id": self.response_id,
            "timings": self.timings.to_json(),
            "request": self.request,
            "response": self.response.to_json() if self.response else None,
            "verdicts": [v.to_json() for v in self.verdicts],
            "raw_sse": self.raw_sse,
            "check_errors": self.check_errors,
            "oracles": self.oracles.to_json() if self.oracles else None,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TurnRecord:
        """Read one line of turns.jsonl back; KeyError, TypeError or ValueError for a record that
        lacks a field or holds one of the wrong type (history.read_history counts it unreadable)."""
        d = _checked(cls, d)
        if not 0 <= d["turn"] < INT64:
            raise ValueError(f"TurnRecord.turn: {d['turn']} is not a turn index")
        return cls(
            run=d["run"],
            session=d["session"],
            turn=d["turn"],
            scenario=d["scenario"],
            seed=d["seed"],
            status=TurnStatus(d["status"]),
            timings=Timings.from_json(d.get("timings") or {}),
            http_status=d.get("http_status"),
            error=d.get("error"),
            error_kind=ErrorKind.read(d.get("error_kind")),
            request=d.get("request") or {},
            response=AssembledResponse.from_json(d["response"]) if d.get("response") else None,
            verdicts=[Verdict.from_json(v) for v in d.get("verdicts") or []],
            raw_sse=d.get("raw_sse"),
            check_errors=d.get("check_errors") or [],
            oracles=OracleReadings.from_json(d["oracles"]) if d.get("oracles") else None,
        )
