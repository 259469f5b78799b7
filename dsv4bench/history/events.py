"""events.jsonl's records: one msgspec Struct per event kind, tagged by `kind`, and their codec.

Each line of events.jsonl is one `Event`: `t_wall_ns` and `t_ns` (wall and monotonic clock,
stamped by HistoryWriter.record as it writes, unless the record carries the moment it is about,
as a /health result does), `kind`, then the kind's fields in the order written here. Other tools
read these names: tests/test_events.py holds them.

Writers: `HistoryWriter.event(kind, **fields)` stays the call site's form (about fifty of them,
several in files under way for other work); it builds the kind's record here, so every event
goes through one of these Structs and one encoder (run_folder.encode_record, after the masking of
secrets). A kind or a field that has no record here is a bug of ours: it raises TypeError
where DSV4BENCH_STRICT_EVENTS is set (the tests set it, tests/conftest.py), and elsewhere the
event is still written as given, so that a run never loses a record to it.

Fields some writers add and others do not are `UNSET` by default, and an UNSET field is left out
of the line, as before: `worker` on any event a Locust worker sent through the master, the
fields of the proxy's refusals, `role` on the /health checks after the drain.

Readers: History.events stays a list of dicts. Every reader (summary, report, plots, the
Locust tab, history_gaps) must read hand-edited and foreign lines, counting what it cannot use,
and reads two or three keys of a few kinds; decoding every line into a Struct would add a second
way to fail for no field it does not already check. `decode_event` gives a typed record to a
reader that wants one, or None for a line that is not one.
"""

from __future__ import annotations

import enum
import json
import os
from typing import Any, Union

import msgspec
from msgspec import UNSET, UnsetType

STRICT_ENV = "DSV4BENCH_STRICT_EVENTS"


class RunEndReason(str, enum.Enum):
    """Why a run ended (`reason` of run_end); summary.json's `end_reason` repeats it."""

    COMPLETE = "complete"
    DURATION = "duration"  # the proxy's --duration was up
    INTERRUPTED = "interrupted"  # Ctrl-C: the history so far is kept and reported
    ERROR = "error"  # our own failure; the error goes on up
    SERVE_METRICS_PORT_TAKEN = "serve_metrics_port_taken"  # --serve-metrics could not bind

    def __str__(self) -> str:
        return self.value


class Event(msgspec.Struct, tag_field="kind", kw_only=True):
    """What every event line holds besides its kind's fields."""

    t_wall_ns: int | UnsetType = UNSET
    t_ns: int | UnsetType = UNSET
    worker: str | UnsetType = UNSET  # the Locust worker that sent it (the master writes it)


# -- the run ---------------------------------------------------------------------------------


class RunStart(Event, tag="run_start", kw_only=True):
    run: str


class RunEnd(Event, tag="run_end", kw_only=True):
    """The run's end, with what the writer wrote and failed to write (HistoryWriter.counts)."""

    run: str
    reason: RunEndReason
    turns_recorded: int | UnsetType = UNSET
    write_failures: dict[str, int] | UnsetType = UNSET
    ascii_escaped_records: int | UnsetType = UNSET


class HarnessClock(Event, tag="harness_clock", kw_only=True):
    """How late the harness's own loop ran (loop/lag_clock.py, LagClock.as_event)."""

    tick_s: float
    stall_s: float
    ticks: int
    lag_p50_ms: float | None
    lag_p99_ms: float | None
    lag_max_ms: float | None
    stalls: int
    stalled_s: float
    longest_stall_s: float


# NOTE: the kinds that end in _error are named ...Failed: a class named ...Error is an exception
# (tests/test_rooms.py holds those to dsv4bench/errors.py's tree).
class HistoryWriteFailed(Event, tag="history_write_error", kw_only=True):
    """A record that could not be written (the first few; run_end counts them all)."""

    file: str | UnsetType = UNSET
    session: str | UnsetType = UNSET
    turn: int | UnsetType = UNSET
    error: str | None


class WedgeCheckFailed(Event, tag="wedge_error", kw_only=True):
    error: str


class RecoverStart(Event, tag="recover_start", kw_only=True):
    cmd: str


class RecoverEnd(Event, tag="recover_end", kw_only=True):
    """--recover-cmd's outcome (harness/recover.py, run_recovery)."""

    cmd: str
    exit_code: int | None
    output_tail: str
    cmd_s: float
    healthy_after_s: float | None


# -- sessions --------------------------------------------------------------------------------


class SessionStart(Event, tag="session_start", kw_only=True):
    session: str
    scenario: str
    seed: Any = UNSET  # not known to the proxy; a replay's as its capture holds it
    attempt: int | UnsetType = UNSET  # agents and Locust: 0, then one more per --kill restart


class SessionEnd(Event, tag="session_end", kw_only=True):
    """`reason`: the session's end (harness/session.py EndReason), or cancelled, proxy_end,
    replayed, worker_lost; `tool_calls` None where the master cannot know them."""

    session: str
    reason: str
    turns: int
    tool_calls: int | None


class SessionRestart(Event, tag="session_restart", kw_only=True):
    session: str
    new_session: str
    attempt: int
    spec: str


# -- the nemesis -----------------------------------------------------------------------------


class Kill(Event, tag="kill", kw_only=True):
    """Sessions killed by a --kill spec: agents' nemesis says whom and how; a Locust kill storm
    says when and how many users (`at_s`, `users`), or that the storm's end stopped them all."""

    spec: str
    sessions: list[str]
    who: str | UnsetType = UNSET
    abort: bool | UnsetType = UNSET
    restart: bool | UnsetType = UNSET
    at_s: float | UnsetType = UNSET
    users: int | UnsetType = UNSET
    reason: str | UnsetType = UNSET


class AbortRequest(Event, tag="abort_request", kw_only=True):
    """POST /abort_request per request id after a kill: {rid: HTTP status or error name}."""

    spec: str
    results: dict[str, Union[int, str]]


# -- the servers -----------------------------------------------------------------------------


class LoadStopped(Event, tag="load_stopped", kw_only=True):
    """The load stopped (t_ns: when) and the drain window began."""

    drain_timeout_s: float


class DrainEnd(Event, tag="drain_end", kw_only=True):
    reason: str  # queues_empty | timeout
    drain_s: float


class Health(Event, tag="health", kw_only=True):
    """One GET of /health or /health_generate (servers/canary.py HealthResult; t_ns: when)."""

    endpoint: str
    result: str
    latency_s: float
    status: int | None
    error: str | None
    role: str | UnsetType = UNSET  # the checks after the drain, by the server's role


class Canary(Event, tag="canary", kw_only=True):
    """One canary chat after the drain (servers/canary.py CanaryResult; t_ns: when)."""

    ok: bool
    endpoint: str
    result: str
    latency_s: float
    error: str | None
    http_status: int | None
    stream: bool
    first_chunk_s: float | None
    role: str


class CanarySkipped(Event, tag="canary_skipped", kw_only=True):
    endpoint: str
    role: str
    reason: str


class ApiKeyHosts(Event, tag="api_key_hosts", kw_only=True):
    """Which hosts got the API key and which were probed without (redact.py KeyScope)."""

    key_sent_to: list[str]
    key_withheld_from: list[str]
    key_to_workers: bool


class RawNotOffered(Event, tag="raw_not_offered", kw_only=True):
    """--raw's reference reading is not offered by this server for this family."""

    family: str
    server: str
    reason: str


# -- after the load: findings alone, persistence ----------------------------------------------


class AloneStart(Event, tag="alone_start", kw_only=True):
    """A stage of harness/alone.py begins: `triage` or `recheck`."""

    stage: str


class CacheFlush(Event, tag="cache_flush", kw_only=True):
    """The server's prefix cache dropped before --recheck (servers/cache_flush.py), or why not."""

    path: str | None
    flushed: bool
    detail: str


class AloneRequest(Event, tag="alone_request", kw_only=True):
    """One finding's request sent again alone (harness/triage.py)."""

    purpose: str
    session: str
    turn: int
    key: str
    status: str
    error: str | None
    codes: list[str]
    ms: float


class AloneEnd(Event, tag="alone_end", kw_only=True):
    requests: int | None
    elapsed_s: float
    error: str | None


class PersistenceStart(Event, tag="persistence_start", kw_only=True):
    sessions: int


class PersistenceSession(Event, tag="persistence_session", kw_only=True):
    fresh: str
    replays: str
    outcome: str


class PersistenceEnd(Event, tag="persistence_end", kw_only=True):
    poisoned: bool | None


class PersistenceSkipped(Event, tag="persistence_skipped", kw_only=True):
    reason: str


class PersistenceFailed(Event, tag="persistence_error", kw_only=True):
    error: str


# -- the proxy and replay ----------------------------------------------------------------------


class UnauditedRequest(Event, tag="unaudited_request", kw_only=True):
    """A request the proxy forwarded without judging it (its body is no JSON object)."""

    path: str
    reason: str
    bytes: int


class PathRefused(Event, tag="path_refused", kw_only=True):
    """A path the proxy refused (400): it could leave the upstream's base path."""

    status: int
    path: str


class RequestTooLarge(Event, tag="request_too_large", kw_only=True):
    """A body over --max-body (413); `declared`: its Content-Length said so up front."""

    status: int
    bytes_seen: int
    max_body: int
    declared: bool


class RequestTimeout(Event, tag="request_timeout", kw_only=True):
    """A body not in within --read-timeout (408)."""

    status: int
    bytes_seen: int


class EventsSuppressed(Event, tag="events_suppressed", kw_only=True):
    """Refusals of one kind (path_refused, ...) past the proxy's budget for noting them, counted
    instead of written one by one (modes/proxy.RefusalLog)."""

    refusal: str  # the kind of the events not written
    count: int


class UpstreamKeepalive(Event, tag="upstream_keepalive", kw_only=True):
    """How long the proxy keeps idle upstream connections, from what it saw of the upstream's
    own limit (wire/upstream_idle.py)."""

    keepalive_s: float  # the pool's hold from now on
    server_idle_s: float | None  # when the upstream closed an idle connection; None: not seen
    how: str  # "closed", "keep-alive header", "open past the watch", or why nothing was learned
    applied: bool  # False: the installed aiohttp keeps the hold it was made with


class ReplayUnplayable(Event, tag="replay_unplayable", kw_only=True):
    session: str
    turn: int
    reason: str


# -- Locust --------------------------------------------------------------------------------------


class HostChanged(Event, tag="host_changed", kw_only=True):
    """The web UI's host differs from the command line's: the key was not sent to it."""

    host: str
    command_line_host: str | None
    key_sent: bool
    key_given: bool


class WorkerLost(Event, tag="worker_lost", kw_only=True):
    """A worker stopped answering the master (`worker`: which)."""


class WorkerRecorded(Event, tag="worker_recorded", kw_only=True):
    """What one worker recorded, sent at the stop, to check the merged history against."""

    worker_index: int | None
    turns: int
    codes: dict[str, int]


class TurnLost(Event, tag="turn_lost", kw_only=True):
    """A turn in flight on a worker that was lost."""

    session: str
    turn: int
    reason: str


EVENT_TYPES: dict[str, type[Event]] = {
    cls.__struct_config__.tag: cls  # type: ignore[misc]  # msgspec's tag may be an int; ours are all str
    for cls in (
        RunStart,
        RunEnd,
        HarnessClock,
        HistoryWriteFailed,
        WedgeCheckFailed,
        RecoverStart,
        RecoverEnd,
        SessionStart,
        SessionEnd,
        SessionRestart,
        Kill,
        AbortRequest,
        LoadStopped,
        DrainEnd,
        Health,
        Canary,
        CanarySkipped,
        ApiKeyHosts,
        RawNotOffered,
        AloneStart,
        CacheFlush,
        AloneRequest,
        AloneEnd,
        PersistenceStart,
        PersistenceSession,
        PersistenceEnd,
        PersistenceSkipped,
        PersistenceFailed,
        UnauditedRequest,
        PathRefused,
        RequestTooLarge,
        RequestTimeout,
        EventsSuppressed,
        UpstreamKeepalive,
        ReplayUnplayable,
        HostChanged,
        WorkerLost,
        WorkerRecorded,
        TurnLost,
    )
}
AnyEvent = Union[tuple(EVENT_TYPES.values())]  # type: ignore[valid-type]  # built from the table at run time
_DECODER = msgspec.json.Decoder(AnyEvent)


def strict() -> bool:
    """Whether a kind or field without a record here raises (the tests) or is written as given."""
    return bool(os.environ.get(STRICT_ENV))


def build_event(kind: str, fields: dict[str, Any]) -> Event:
    """The record of one event; TypeError naming a kind or field it does not declare, or a
    field it requires that is missing."""
    cls = EVENT_TYPES.get(kind)
    if cls is None:
        raise TypeError(f"event kind {kind!r} has no record in dsv4bench/history/events.py")
    if unknown := [k for k in fields if k not in cls.__struct_fields__]:
        raise TypeError(f"event {kind!r}: field(s) {unknown} not declared in dsv4bench/history/events.py")
    try:
        return cls(**fields)
    except TypeError as e:  # a required field left out
        raise TypeError(f"event {kind!r}: {e}") from e


def event_object(event: Event) -> dict[str, Any]:
    """The line's JSON object: the clock stamps, then `kind`, then the rest in declared order
    (the order every writer wrote before there were records)."""
    obj = msgspec.to_builtins(event, enc_hook=str)
    head = {k: obj.pop(k) for k in ("t_wall_ns", "t_ns", "kind") if k in obj}
    return {**head, **obj}


def _decode(line: bytes | str) -> Event:
    try:
        return _DECODER.decode(line)
    except msgspec.DecodeError:
        # msgspec reads UTF-8 only: a line written with \u escapes for a lone surrogate (run_folder.
        # encode_record) is read by json, then typed by msgspec all the same.
        return msgspec.convert(json.loads(line), AnyEvent)


def check_written(event: Event, data: bytes) -> None:
    """In strict mode, that the line reads back as the record it was: a field of the wrong type
    (a reason outside RunEndReason, a count that is text) fails where it is written."""
    try:
        back = _decode(data)
    except msgspec.ValidationError as e:
        raise TypeError(f"event {event.__struct_config__.tag!r} does not read back: {e}") from e
    if type(back) is not type(event):
        raise TypeError(f"event {event.__struct_config__.tag!r} reads back as {type(back).__name__}")


def decode_event(line: bytes | str) -> Event | None:
    """One line of events.jsonl as its record; None for a line that is not one (torn, hand-edited,
    of a kind this version does not know, a field of the wrong type)."""
    try:
        return _decode(line)
    except (msgspec.ValidationError, ValueError, RecursionError):  # json's errors are ValueErrors
        return None
