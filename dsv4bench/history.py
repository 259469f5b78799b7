"""The run folder: append-only JSONL files flushed per record, and a reader that tolerates a
history cut short by SIGKILL (a torn last line is skipped, never fatal).

Layout of one run folder (DESIGN §3):
  run.json       written once at start: run id, command line, config, server facts
  turns.jsonl    one TurnRecord per agent turn
  events.jsonl   lifecycle and nemesis events: {"t_wall_ns", "t_ns", "kind", ...}
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
from typing import Any, TextIO

from .records import TurnRecord

RUN_FILE = "run.json"
TURNS_FILE = "turns.jsonl"
EVENTS_FILE = "events.jsonl"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.md"


class JsonlWriter:
    """Appends one JSON object per line and flushes it to the OS before returning.

    Flush (not fsync) per record: a killed harness loses nothing the kernel has seen;
    only a machine crash could. Thread-safe so monitors and sessions can share one file.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._f: TextIO = open(path, "a", encoding="utf-8")
        self._lock = threading.Lock()

    def write(self, obj: dict[str, Any]) -> None:
        line = json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n"
        with self._lock:
            self._f.write(line)
            self._f.flush()

    def close(self) -> None:
        with self._lock:
            if not self._f.closed:
                self._f.close()


class HistoryWriter:
    """Owns the files of one run folder while the run goes on."""

    def __init__(self, run_dir: Path, run_info: dict[str, Any]) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir = run_dir
        write_json_atomic(run_dir / RUN_FILE, run_info)
        self.turns = JsonlWriter(run_dir / TURNS_FILE)
        self.events = JsonlWriter(run_dir / EVENTS_FILE)
        self.metrics = JsonlWriter(run_dir / METRICS_FILE)

    def turn(self, record: TurnRecord) -> None:
        self.turns.write(record.to_json())

    def event(self, kind: str, **fields: Any) -> None:
        self.events.write({"t_wall_ns": time.time_ns(), "t_ns": time.monotonic_ns(), "kind": kind, **fields})

    def update_run_info(self, run_info: dict[str, Any]) -> None:
        write_json_atomic(self.run_dir / RUN_FILE, run_info)

    def close(self) -> None:
        for w in (self.turns, self.events, self.metrics):
            w.close()


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON through a temp file and rename, so readers never see half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def read_jsonl(path: Path) -> tuple[list[dict[str, Any]], int]:
    """Read a JSONL file; returns (records, number of unreadable lines skipped)."""
    if not path.exists():
        return [], 0
    out: list[dict[str, Any]] = []
    bad = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                bad += 1  # a torn last line from a killed harness
                continue
            if isinstance(obj, dict):
                out.append(obj)
            else:
                bad += 1
    return out, bad


@dataclass
class History:
    """A run folder read back into memory."""

    run_dir: Path
    run: dict[str, Any]
    turns: list[TurnRecord]
    events: list[dict[str, Any]]
    metrics: list[dict[str, Any]] = field(default_factory=list)
    skipped_lines: int = 0

    @property
    def complete(self) -> bool:
        """True when the run recorded its own end (it was not killed mid-way)."""
        return any(e.get("kind") == "run_end" for e in self.events)


class HistoryError(Exception):
    """The folder is not a dsv4bench run."""


def read_history(run_dir: Path) -> History:
    """Load a (possibly partial) run folder."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise HistoryError(f"{run_dir} is not a directory")
    if not (run_dir / TURNS_FILE).exists() and not (run_dir / RUN_FILE).exists():
        raise HistoryError(f"{run_dir} holds no {TURNS_FILE} or {RUN_FILE}: not a dsv4bench run folder")
    run: dict[str, Any] = {}
    if (run_dir / RUN_FILE).exists():
        try:
            run = json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))
        except ValueError:
            run = {}
    raw_turns, bad_t = read_jsonl(run_dir / TURNS_FILE)
    turns: list[TurnRecord] = []
    for d in raw_turns:
        try:
            turns.append(TurnRecord.from_json(d))
        except (KeyError, ValueError, TypeError):
            bad_t += 1
    events, bad_e = read_jsonl(run_dir / EVENTS_FILE)
    metrics, bad_m = read_jsonl(run_dir / METRICS_FILE)
    return History(run_dir, run, turns, events, metrics, bad_t + bad_e + bad_m)
