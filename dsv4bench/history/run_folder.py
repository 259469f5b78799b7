"""The run folder: append-only JSONL files written through per record, and a reader that tolerates a
history cut short by SIGKILL (a torn last line is skipped, never fatal).

Layout of one run folder (a stable format: other tools read it):
  run.json       written once at start: run id, command line, config, server facts, --raw oracles
  turns.jsonl    one TurnRecord per agent turn
  events.jsonl   lifecycle and nemesis events, one record of events.py a line: {"t_wall_ns", "t_ns", "kind", ...}
  metrics.jsonl  scraped Prometheus samples per endpoint
  summary.json, report.md, plots/*.png   derived; `dsv4bench report` rebuilds them
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from dsv4bench.errors import Dsv4benchError
from dsv4bench.history.events import Event, RunEnd, build_event, check_written, event_object, strict
from dsv4bench.history.records import TurnRecord
from dsv4bench.history.redact import Redactor

RUN_FILE = "run.json"
TURNS_FILE = "turns.jsonl"
EVENTS_FILE = "events.jsonl"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.md"


def encode_json(obj: Any, redactor: Redactor | None = None, **kw: Any) -> tuple[bytes, bool]:
    """`obj` as UTF-8 JSON bytes, and whether ASCII escapes had to be used.

    Text is written as itself where UTF-8 can encode it; a string holding a lone surrogate
    (valid in a JSON escape, not in UTF-8) makes the whole object fall back to ASCII escapes,
    which read back to the very same string. Secrets are masked on the object before it is
    serialized (redact.Redactor.value): always the fields and headers that carry credentials,
    and `redactor`'s secret values too; never over the serialized text, which a secret such as
    `true` or `"` would corrupt. Raises TypeError / ValueError / RecursionError only for an
    object that is not JSON at all (too deep, a circular reference).
    """
    obj = (redactor or _STRUCTURE_ONLY).value(obj)
    text = json.dumps(obj, ensure_ascii=False, default=str, **kw)
    try:
        return text.encode("utf-8"), False
    except UnicodeEncodeError:
        return json.dumps(obj, ensure_ascii=True, default=str, **kw).encode("ascii"), True


_STRUCTURE_ONLY = Redactor()
_RECORD_ENCODER = msgspec.json.Encoder()


def encode_record(
    record: msgspec.Struct | dict[str, Any], redactor: Redactor | None = None, indent: int = 0
) -> tuple[bytes, bool]:
    """A typed record (an event, the summary; or its JSON object) as UTF-8 JSON bytes, and whether
    ASCII escapes had to be used: the one codec of the run folder's typed records, with
    encode_json's guarantees.
    Secrets are masked on the record's objects first (redact.Redactor.value), so what is written
    is the same as encode_json would write, key for key; `indent` > 0 writes it indented."""
    obj = (redactor or _STRUCTURE_ONLY).value(msgspec.to_builtins(record, enc_hook=str))
    try:
        data = _RECORD_ENCODER.encode(obj)
    except UnicodeEncodeError:
        # msgspec writes UTF-8 only; a lone surrogate reads back as itself only through a \u escape.
        compact = None if indent else (",", ":")
        return json.dumps(obj, ensure_ascii=True, indent=indent or None, separators=compact).encode("ascii"), True
    return (msgspec.json.format(data, indent=indent) if indent else data), False


# Run folders hold prompts, answers and captures: private to the user who ran them, whatever the umask.
DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path) -> None:
    """Create the folder `path` (and its parents) and make it DIR_MODE."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, DIR_MODE)


def open_private(path: Path, flags: int) -> int:
    """os.open of `path` with FILE_MODE at creation and after: a file the run writes is never
    readable by other users, not even between its creation and a later chmod."""
    fd = os.open(path, flags | os.O_CREAT, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)  # the umask may have taken bits off; an older file gets it too
    except OSError:
        pass  # a file of another owner (a joined folder): it keeps its mode
    return fd


class JsonlWriter:
    """Appends one JSON object per line and hands it to the OS before returning.

    Unbuffered (not fsynced) per record: a killed harness loses nothing the kernel has seen;
    only a machine crash could. Thread-safe so monitors and sessions can share one file.
    A write never raises: one that fails (disk full, an object that is not JSON) is counted in
    `failed`, its error kept in `last_error`, and the run goes on.
    """

    def __init__(self, path: Path, redactor: Redactor | None = None) -> None:
        self.path = path
        self.redactor = redactor if redactor else None
        self._f = os.fdopen(open_private(path, os.O_WRONLY | os.O_APPEND), "ab", buffering=0)
        self._lock = threading.Lock()
        self.written = 0
        self.failed = 0
        self.escaped = 0  # records written with ASCII escapes (they held lone surrogates)
        self.last_error: str | None = None

    def write(self, obj: dict[str, Any]) -> bool:
        """Append one record; False (and counted) when it could not be written."""
        try:
            data, escaped = encode_json(obj, self.redactor, separators=(",", ":"))
        except (TypeError, ValueError, RecursionError) as e:
            return self._fail(e)
        return self.append(data, escaped)

    def append(self, data: bytes, escaped: bool = False) -> bool:
        """Append one record already encoded (one line, without its newline); False (and counted)
        when it could not be written."""
        data += b"\n"
        with self._lock:
            try:
                view = memoryview(data)
                while view:
                    n = self._f.write(view)
                    view = view[n or 0 :]  # FileIO.write may write less than asked
            except (OSError, ValueError) as e:  # ValueError: the file is closed
                return self._fail(e)
            self.written += 1
            self.escaped += escaped
        return True

    def _fail(self, e: BaseException) -> bool:
        self.failed += 1
        self.last_error = f"{type(e).__name__}: {e}"[:300]
        return False

    def close(self) -> None:
        with self._lock:
            if not self._f.closed:
                try:
                    self._f.close()
                except OSError:
                    pass


# Events about failed turn writes written one by one; the rest are counted in run_end only.
WRITE_ERROR_EVENTS = 20


class HistoryWriter:
    """Owns the files of one run folder while the run goes on.

    Nothing it does after the folder exists raises: a record it could not write is counted,
    and the `run_end` event carries the counts (`turns_recorded`, `write_failures`), so that
    `dsv4bench report` can tell a complete history from one that lost records.
    """

    def __init__(self, run_dir: Path, run_info: dict[str, Any] | None, redactor: Redactor | None = None) -> None:
        """A new run folder with `run_info` as its run.json; None: join the folder another process
        of the same run created (Locust mode's server watch writes its samples and checks beside
        the recorder's turns: each record is one append, so the two never tear each other's lines)."""
        if run_info is not None:
            private_dir(run_dir)
            write_json_atomic(run_dir / RUN_FILE, run_info, redactor)
        self.redactor = redactor
        self.run_dir = run_dir
        self.turns = JsonlWriter(run_dir / TURNS_FILE, redactor)
        self.events = JsonlWriter(run_dir / EVENTS_FILE, redactor)
        self.metrics = JsonlWriter(run_dir / METRICS_FILE, redactor)
        self.run_info_failures = 0

    def turn(self, record: TurnRecord) -> bool:
        """Append one turn record; False when it could not be written (counted, and noted as a
        `history_write_error` event for the first few)."""
        try:
            obj = record.to_json()
        except Exception as e:  # noqa: BLE001 - a record that cannot be built is a lost record, not a crash
            self.turns._fail(e)
            ok = False
        else:
            ok = self.turns.write(obj)
        if not ok and self.turns.failed <= WRITE_ERROR_EVENTS:
            self.event(
                "history_write_error",
                file=TURNS_FILE,
                session=str(record.session),
                turn=record.turn,
                error=self.turns.last_error,
            )
        return ok

    def event(self, kind: str, **fields: Any) -> bool:
        """Append one event, as the record of its kind (events.py) built from `fields`. One of a
        kind or with a field events.py does not declare raises TypeError in strict mode (the
        tests), and is otherwise written as given: a bug of ours loses no record of the run."""
        try:
            event = build_event(kind, fields)
        except TypeError:  # build_event's: a kind or field events.py does not declare
            if strict():
                raise
            counts = self.counts() if kind == "run_end" else {}
            return self.events.write(
                {"t_wall_ns": time.time_ns(), "t_ns": time.monotonic_ns(), "kind": kind, **fields, **counts}
            )
        return self.record(event)

    def record(self, event: Event) -> bool:
        """Append one event record, stamped now unless it carries its own moment; a `run_end` gets
        the run's record counts added. False (and counted) when it could not be written."""
        now = {"t_wall_ns": time.time_ns(), "t_ns": time.monotonic_ns()}
        changes: dict[str, Any] = {k: v for k, v in now.items() if getattr(event, k) is msgspec.UNSET}
        if isinstance(event, RunEnd):
            changes.update(self.counts())
        event = msgspec.structs.replace(event, **changes) if changes else event
        try:
            data, escaped = encode_record(event_object(event), self.redactor)
        except (TypeError, ValueError, RecursionError) as e:
            return self.events._fail(e)
        if strict():
            check_written(event, data)
        return self.events.append(data, escaped)

    def counts(self) -> dict[str, Any]:
        """What was written and what failed, per file, so far."""
        return {
            "turns_recorded": self.turns.written,
            "write_failures": {
                TURNS_FILE: self.turns.failed,
                EVENTS_FILE: self.events.failed,
                METRICS_FILE: self.metrics.failed,
                RUN_FILE: self.run_info_failures,
            },
            "ascii_escaped_records": self.turns.escaped + self.events.escaped + self.metrics.escaped,
        }

    def update_run_info(self, run_info: dict[str, Any]) -> bool:
        """Rewrite run.json; False (and counted) when it could not be written."""
        try:
            write_json_atomic(self.run_dir / RUN_FILE, run_info, self.redactor)
        except (OSError, TypeError, ValueError, RecursionError):
            self.run_info_failures += 1
            return False
        return True

    def close(self) -> None:
        for w in (self.turns, self.events, self.metrics):
            w.close()


def write_atomic(path: Path, data: bytes) -> None:
    """Write through a temp file and rename, so readers never see half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    with os.fdopen(open_private(tmp, os.O_WRONLY | os.O_TRUNC), "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def write_json_atomic(path: Path, obj: Any, redactor: Redactor | None = None) -> None:
    """Write JSON atomically (see `write_atomic`)."""
    data, _ = encode_json(obj, redactor, indent=2)
    write_atomic(path, data + b"\n")


def read_jsonl(path: Path) -> tuple[list[dict[str, Any]], int]:
    """Read a JSONL file; returns (records, number of unreadable lines skipped)."""
    records, bad, _ = _read_jsonl(path)
    return records, bad


def _read_jsonl(path: Path) -> tuple[list[dict[str, Any]], int, bool]:
    """(records, unreadable lines, whether the last line is a torn write: unreadable and not
    ended by a newline, what a SIGKILL mid-write leaves)."""
    if not path.exists():
        return [], 0, False
    out: list[dict[str, Any]] = []
    bad = 0
    torn = False
    with open(path, encoding="utf-8", errors="replace") as f:
        for raw in f:
            line = raw.strip()
            if not line:
                continue
            torn = False
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError):
                bad += 1
                torn = not raw.endswith("\n")
                continue
            if isinstance(obj, dict):
                out.append(obj)
            else:
                bad += 1
    return out, bad, torn


@dataclass
class History:
    """A run folder read back into memory.

    `unreadable` counts the lines of each JSONL file that could not be read back (torn,
    undecodable, or not a record); `torn_tail` names the files whose last line is a torn write;
    `run_unreadable`: a run.json is there but is not a JSON object (`run` is then empty);
    `unopened`: the JSONL files that could not be opened at all, each with why.
    """

    run_dir: Path
    run: dict[str, Any]
    turns: list[TurnRecord]
    events: list[dict[str, Any]]
    metrics: list[dict[str, Any]] = field(default_factory=list)
    skipped_lines: int = 0
    unreadable: dict[str, int] = field(default_factory=dict)
    torn_tail: frozenset[str] = frozenset()
    run_unreadable: bool = False
    unopened: dict[str, str] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """True when the run recorded its own end (it was not killed mid-way)."""
        return any(e.get("kind") == "run_end" for e in self.events)

    @property
    def run_end(self) -> dict[str, Any]:
        """The run's last `run_end` event; {} when it recorded none."""
        return next((e for e in reversed(self.events) if e.get("kind") == "run_end"), {})


def history_gaps(history: History) -> list[str]:
    """Why this history cannot be trusted to hold every turn of its run, one reason a line;
    [] when nothing shows a loss.

    A run that did not finish (no `run_end`: SIGKILL) is partial, not lossy: a torn last line
    is what it leaves, and is not a gap. Gaps are: writes the run itself counted as failed
    (`run_end.write_failures`, or `history_write_error` events); fewer readable turns than `run_end.turns_recorded`; a
    session whose `session_end` counts more turns than the turns recorded for it; any other
    unreadable line (of a finished run, or before the last line); a run.json that cannot be read
    (it holds the wedge findings); a file that cannot be opened, or a run's missing turns.jsonl.
    """
    gaps: list[str] = []
    end = history.run_end
    failures = end.get("write_failures")
    if isinstance(failures, dict):
        failed = {str(k): v for k, v in failures.items() if isinstance(v, int) and v > 0}
        if failed:
            gaps.append("the run could not write " + ", ".join(f"{n:,} record(s) of {k}" for k, n in failed.items()))
    elif lost := sum(1 for e in history.events if e.get("kind") == "history_write_error"):
        gaps.append(f"the run could not write {lost:,} record(s) (history_write_error events)")
    recorded = end.get("turns_recorded")
    if isinstance(recorded, int) and recorded > len(history.turns):
        gaps.append(f"the run wrote {recorded:,} turn records; {len(history.turns):,} can be read back")
    per_session: dict[str, int] = {}
    for t in history.turns:
        per_session[t.session] = per_session.get(t.session, 0) + 1
    short = []
    for e in history.events:
        n = e.get("turns")
        if e.get("kind") == "session_end" and isinstance(n, int) and not isinstance(n, bool):
            have = per_session.get(str(e.get("session")), 0)
            if have < n:
                short.append((str(e.get("session")), n, have))
    if short:
        sid, n, have = short[0]
        more = f" (and {len(short) - 1:,} more sessions)" if len(short) > 1 else ""
        gaps.append(f"session {sid} ended after {n:,} turns but {have:,} are recorded{more}")
    if history.run_unreadable:
        gaps.append(f"{RUN_FILE} could not be read: the run's settings and wedge findings are unknown")
    gaps += [f"{name} could not be read ({why})" for name, why in history.unopened.items()]
    for name, bad in history.unreadable.items():
        lost = bad - (1 if name in history.torn_tail and not history.complete else 0)
        if lost > 0:
            gaps.append(f"{lost:,} unreadable line(s) in {name}")
    return gaps


class HistoryError(Dsv4benchError):
    """The folder is not a dsv4bench run."""


class ReportError(Dsv4benchError):
    """The files derived from a run's history (summary.json, report.md, plots) could not be
    written: a full disk, a read-only folder. The history itself stands and rebuilds them."""


def find_run_folder(path: Path, flag: str, error: type[Exception] = HistoryError) -> Path:
    """The run folder named by `flag`'s value `path`: itself, or the one run folder an --out
    folder holds; `error` (one line naming `flag`) when there is none or more than one."""
    if path.is_file():
        raise error(f"{flag} {path}: a file, not a run folder (name the folder that holds {TURNS_FILE})")
    if not path.is_dir():
        raise error(f"{flag} {path}: no such folder")
    if (path / TURNS_FILE).is_file():
        return path
    runs = sorted(p for p in path.iterdir() if (p / TURNS_FILE).is_file())
    if len(runs) == 1:
        return runs[0]
    if not runs:
        raise error(f"{flag} {path}: not a dsv4bench run folder (no {TURNS_FILE})")
    raise error(f"{flag} {path}: holds {len(runs)} runs; name one of them, e.g. {runs[-1]}")


def _read_run_file(path: Path) -> tuple[dict[str, Any], bool]:
    """run.json's object, and whether a run.json is there that could not be read as one (torn by
    hand, not JSON, not an object): then its config and wedge findings are unknown. A folder
    without one (turns.jsonl only, as from another tool) has simply none."""
    if not path.exists():
        return {}, False
    try:
        loaded = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, ValueError, RecursionError):
        return {}, True
    return (loaded, False) if isinstance(loaded, dict) else ({}, True)


def read_history(run_dir: Path) -> History:
    """Load a (possibly partial) run folder."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise HistoryError(f"{run_dir} is not a directory")
    if not (run_dir / TURNS_FILE).exists() and not (run_dir / RUN_FILE).exists():
        raise HistoryError(f"{run_dir} holds no {TURNS_FILE} or {RUN_FILE}: not a dsv4bench run folder")
    run, run_unreadable = _read_run_file(run_dir / RUN_FILE)
    unopened: dict[str, str] = {}
    if run and not (run_dir / TURNS_FILE).exists():  # every run creates it as it starts
        unopened[TURNS_FILE] = "missing"
    raw_turns, bad_t, torn_t = _read_file(run_dir, TURNS_FILE, unopened)
    turns: list[TurnRecord] = []
    for d in raw_turns:
        try:
            turns.append(TurnRecord.from_json(d))
        except (KeyError, ValueError, TypeError, AttributeError):
            bad_t += 1
    events, bad_e, torn_e = _read_file(run_dir, EVENTS_FILE, unopened)
    metrics, bad_m, torn_m = _read_file(run_dir, METRICS_FILE, unopened)
    unreadable = {TURNS_FILE: bad_t, EVENTS_FILE: bad_e, METRICS_FILE: bad_m}
    torn = frozenset(n for n, flag in ((TURNS_FILE, torn_t), (EVENTS_FILE, torn_e), (METRICS_FILE, torn_m)) if flag)
    return History(
        run_dir, run, turns, events, metrics, bad_t + bad_e + bad_m, unreadable, torn, run_unreadable, unopened
    )


def _read_file(run_dir: Path, name: str, unopened: dict[str, str]) -> tuple[list[dict[str, Any]], int, bool]:
    """`_read_jsonl` of one file of the folder; one that cannot be opened (a folder in its place,
    no permission) reads as empty, with the reason put in `unopened`."""
    try:
        return _read_jsonl(run_dir / name)
    except OSError as e:
        unopened[name] = e.strerror or str(e)
        return [], 0, False
