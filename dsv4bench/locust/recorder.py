"""Where a Locust process's turns and session events go during one test, and the test's run
folder.

One test (a start and a stop, headless or from the web UI) is one run folder, as one `agents`
run is: the same run.json, turns.jsonl, events.jsonl, metrics.jsonl, and at its end the same
summary.json, report.md and plots. The process that owns it (Locust's master, or the only
process) writes it; a worker sends each record to its master as it is made
(`dsv4bench:turn`, `dsv4bench:event` messages), so the master's folder is the merged history,
and a worker that dies loses only the turns it had in flight: the master ends those sessions
`worker_lost` and says which turn was lost (`turn_lost`).

Sessions are numbered per worker, `worker_index * WORKER_STRIDE + n`, so no two workers play
the same seed.
"""

from __future__ import annotations

import datetime as dt
import itertools
import logging
import secrets
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsv4bench.history.codes import CORRUPTION, ORACLE, code_class, meaning
from dsv4bench.history.events import RunEndReason
from dsv4bench.history.run_folder import HistoryWriter
from dsv4bench.history.records import TurnRecord, TurnStatus
from dsv4bench.report.slo import SloTally, tally_for
from dsv4bench.report.counting import tool_call_count, turn_codes
from dsv4bench.locust.plan import Plan

log = logging.getLogger("dsv4bench.locust")

WORKER_STRIDE = 1_000_000
_SEED_STRIDE = 100_000  # as driver.session_seed: session i of run seed s plays seed s * stride + i
EXAMPLES_PER_CODE = 5
TURN_MESSAGE, EVENT_MESSAGE = "dsv4bench:turn", "dsv4bench:event"


@dataclass
class Tally:
    """What the web UI's dsv4bench tab shows while the test runs, counted as summary.py counts
    for the report: turns per code (killed turns judged by nothing), rates per turn and, for the
    corruption and oracle codes, per tool call."""

    turns: int = 0
    ok: int = 0
    killed: int = 0
    tool_calls: int = 0
    by_code: Counter[str] = field(default_factory=Counter)  # turns with the code
    examples: dict[str, deque] = field(default_factory=dict)  # code -> its latest {session, turn, what}
    slo: SloTally | None = None  # --slo: the turns against the run's latency targets

    def add(self, rec: TurnRecord) -> None:
        self.turns += 1
        self.ok += rec.status is TurnStatus.OK
        self.killed += rec.status is TurnStatus.KILLED
        self.tool_calls += tool_call_count(rec)
        if self.slo is not None:
            self.slo.add(rec)
        for code in turn_codes(rec):
            self.by_code[code] += 1
            found = next((v for v in rec.verdicts if v.code == code), None)
            what = (found.detail if found is not None else "") or rec.error or code
            self.examples.setdefault(code, deque(maxlen=EXAMPLES_PER_CODE)).append(
                {"session": rec.session, "turn": rec.turn, "what": str(what)[:300]}
            )

    def rows(self) -> list[dict[str, Any]]:
        """One row per code seen: turns, per turn, per tool call (None where it does not apply)."""
        out = []
        for code, n in sorted(self.by_code.items(), key=lambda kv: (-kv[1], kv[0])):
            per_call = code_class(code) in (CORRUPTION, ORACLE)
            base = self.ok if per_call else self.turns - self.killed
            out.append(
                {
                    "code": code,
                    "family": code_class(code),
                    "meaning": meaning(code),
                    "turns": n,
                    "per_turn": n / base if base else None,
                    "per_tool_call": n / self.tool_calls if per_call and self.tool_calls else None,
                }
            )
        return out


class LocustRun:
    """One test as this process plays it: its plan, its run id, its session numbering, and where
    its records go (a RunFolder in the owning process, the master from a worker)."""

    def __init__(
        self, plan: Plan, run_id: str, worker_index: int = 0, send: Any = None, folder: RunFolder | None = None
    ) -> None:
        self.plan, self.run_id, self.worker_index = plan, run_id, worker_index
        self._send, self.folder = send, folder
        self._numbers = itertools.count()
        self.sent = Tally()  # a worker's own count of what it sent, told to the master at the stop

    def next_session_index(self) -> int:
        return self.worker_index * WORKER_STRIDE + next(self._numbers)

    @staticmethod
    def session_id(index: int) -> str:
        return f"s{index:05d}"

    def session_seed(self, index: int) -> int:
        return self.plan.config.seed * _SEED_STRIDE + index

    def turn(self, rec: TurnRecord) -> None:
        if self.folder is not None:
            self.folder.turn(rec.to_json(), rec)
        else:
            self._send(TURN_MESSAGE, rec.to_json())
            self.sent.add(rec)

    def report_sent(self) -> None:
        """A worker at the test's stop: what it recorded, so the merged history can be checked
        against the sum of its workers (`worker_recorded` events)."""
        if self.folder is None:
            self.event(
                "worker_recorded", worker_index=self.worker_index, turns=self.sent.turns, codes=dict(self.sent.by_code)
            )

    def event(self, kind: str, **fields: Any) -> None:
        if self.folder is not None:
            self.folder.event(kind, **fields)
        else:
            self._send(EVENT_MESSAGE, {"kind": kind, "t_wall_ns": time.time_ns(), **fields})


class RunFolder:
    """The run folder of one test, in the process that owns it."""

    def __init__(self, plan: Plan, run_id: str, run_dir: Path, locust_info: dict[str, Any]) -> None:
        self.plan, self.run_id, self.run_dir = plan, run_id, run_dir
        self.run_info: dict[str, Any] = {
            "run": run_id,
            "command": plan.command,
            "config": plan.config.to_json(),
            "model": plan.model,
            "server": plan.facts,
            "started": dt.datetime.now(dt.timezone.utc).isoformat(),
            "locust": locust_info,
        }
        self.history = HistoryWriter(run_dir, self.run_info, plan.config.redactor)
        self.tally = Tally(slo=tally_for(plan.config.slo_targets))
        self.open_sessions: dict[str, dict[str, Any]] = {}  # session -> {"worker", "turns"}
        self.history.event("run_start", run=run_id)

    @staticmethod
    def new(plan: Plan, locust_info: dict[str, Any]) -> RunFolder:
        """A fresh, sortable, unique folder under the plan's --out."""
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        run_id = f"{stamp}-locust-{plan.config.scenario}-{secrets.token_hex(2)}"
        return RunFolder(plan, run_id, plan.config.out / run_id, locust_info)

    def turn(self, obj: dict[str, Any], rec: TurnRecord | None = None, worker: str | None = None) -> None:
        """One turn record (its JSON as it came, and read back when it came over the wire)."""
        try:
            rec = rec or TurnRecord.from_json(obj)
        except (KeyError, TypeError, ValueError) as e:
            self.history.event(
                "history_write_error", file="turns.jsonl", error=f"an unreadable turn from {worker}: {e}"
            )
            return
        self.history.turns.write(obj)
        self.tally.add(rec)
        if (s := self.open_sessions.get(rec.session)) is not None:
            s["turns"] += 1

    def event(self, kind: str, worker: str | None = None, **fields: Any) -> None:
        session = fields.get("session")
        if kind == "session_start" and isinstance(session, str):
            self.open_sessions[session] = {"worker": worker, "turns": 0}
        elif kind == "session_end" and isinstance(session, str):
            self.open_sessions.pop(session, None)
        fields.pop("t_wall_ns", None)
        self.history.event(kind, **({"worker": worker} if worker else {}), **fields)

    def worker_lost(self, worker: str) -> None:
        """A worker stopped answering: its open sessions end here, their turn in flight lost."""
        for session, s in list(self.open_sessions.items()):
            if s["worker"] != worker:
                continue
            self.history.event(
                "turn_lost",
                session=session,
                turn=s["turns"],
                worker=worker,
                reason="its worker stopped answering the master",
            )
            self.event(
                "session_end", worker=worker, session=session, reason="worker_lost", turns=s["turns"], tool_calls=None
            )

    def close(self, reason: RunEndReason) -> None:
        self.history.event("run_end", run=self.run_id, reason=reason)
        self.history.close()


_current: LocustRun | None = None


def current() -> LocustRun:
    """The test this process plays now (set at test start by the locustfile)."""
    assert _current is not None, "no test has started in this process"
    return _current


def current_or_none() -> LocustRun | None:
    return _current


def set_current(run: LocustRun | None) -> None:
    global _current
    _current = run
