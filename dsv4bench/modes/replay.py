"""`dsv4bench agents --replay CAPTURE`: a capture's conversations sent again, turn by turn.

A capture is the run folder of `dsv4bench proxy --capture`: every turn it recorded keeps the
exact request the user's agent sent (body, and headers with credentials masked) and when it
was sent. A replay sends each session's recorded requests one after the other, as recorded:
a conversation's next request is the recorded one, whatever the server answers now, so the
replay is the user's own traffic, content and all, where other replays only keep its shape.
Sessions run side by side up to --concurrency; each starts at its recorded offset from the
capture's first request, and each turn at its recorded offset from its session's first,
divided by --speed (speed 0: as fast as the server answers). A turn never starts before the
previous turn of its session has its answer: a client waits for one before sending the next.

Every answer is read and judged as `agents` reads and judges its own (client.chat_turn,
checks.run_checks), into a normal run folder under the capture's session ids and turn numbers,
so `dsv4bench report` and `--reference CAPTURE` (the capture's own answers: a greedy turn
answered otherwise now is reference_mismatch) line up with the capture turn for turn.

A turn recorded without its body (a proxy run without --capture keeps only failing turns')
cannot be sent: it is counted, noted as a `replay_unplayable` event and said on the console.
"""

from __future__ import annotations

import datetime as dt
import math
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from dsv4bench.errors import UsageError
from dsv4bench.loop import fair_loop
from dsv4bench.checks import run_checks
from dsv4bench.wire.client import chat_turn
from dsv4bench.harness.config import RunConfig
from dsv4bench.harness.driver import make_client
from dsv4bench.history.events import RunEndReason
from dsv4bench.history.run_folder import TURNS_FILE, HistoryWriter, find_run_folder, read_jsonl
from dsv4bench.harness.progress import LiveStats, ProgressView
from dsv4bench.history.records import TurnStatus
from dsv4bench.history.redact import MASK
from dsv4bench.harness.reference_run import ReferenceAnswers
from dsv4bench.report import build_report
from dsv4bench.wire.turn_answer import TurnOutcome
from dsv4bench.harness.turn_judge import client_request_summary, keeps_evidence, outcome_record, request_context

# RFC 9110 section 7.6.1: meaningful for one connection only, never forwarded nor replayed.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
# Recorded headers the replay's own client sets for its own connection and body.
_SET_BY_CLIENT = frozenset({"host", "content-length", "expect", "accept-encoding", "content-type"})
RUN_HEADER = "x-dsv4bench-run"  # the replay tags its requests with its own run id
SPEED_MAX = 0.0  # --speed max: no pacing, each request as soon as its turn may go
# The settings of RunConfig a replay honours: the rest shape generated sessions, and the report
# lists every setting run.json holds, so only these go there.
REPLAY_SETTINGS = ("url", "concurrency", "model", "api_key", "out", "fail_on", "ttft_timeout", "total_timeout")

SendTurn = Callable[[dict[str, Any], dict[str, str]], Awaitable[TurnOutcome]]


class CaptureError(UsageError):
    """The folder cannot be replayed; the CLI prints it as one line."""


def parse_speed(text: str) -> float:
    """--speed: a positive factor on the recorded pace, or 0 / `max` for no pacing at all."""
    if text.strip().lower() == "max":
        return SPEED_MAX
    try:
        speed = float(text)
    except ValueError:
        speed = math.nan
    if not math.isfinite(speed) or speed < 0:
        raise CaptureError(f"--speed takes a positive factor on the recorded pace, or 0 or max; got {text!r}")
    return speed


def paced_offset(recorded_ns: int, origin_ns: int, speed: float) -> float:
    """Seconds after its origin at which something recorded at `recorded_ns` starts again:
    the recorded gap divided by `speed`; 0 with no pacing (speed 0)."""
    if speed == SPEED_MAX:
        return 0.0
    return max(0, recorded_ns - origin_ns) / 1e9 / speed


@dataclass(frozen=True)
class CapturedTurn:
    """One recorded request: where it sits in its conversation, when it was sent, and what it
    was (None: the capture did not keep its body)."""

    session: str
    turn: int
    scenario: str
    seed: int
    start_wall_ns: int
    body: dict[str, Any] | None
    headers: dict[str, str]


@dataclass(frozen=True)
class CapturedSession:
    """One conversation of a capture, its turns in order."""

    session: str
    turns: tuple[CapturedTurn, ...]

    @property
    def start_wall_ns(self) -> int:
        return self.turns[0].start_wall_ns

    @property
    def scenario(self) -> str:
        return self.turns[0].scenario

    @property
    def seed(self) -> int:
        return self.turns[0].seed


@dataclass(frozen=True)
class Capture:
    """A capture read back: its conversations in the order they started."""

    run_dir: Path
    sessions: tuple[CapturedSession, ...]

    @property
    def start_wall_ns(self) -> int:
        return min(s.start_wall_ns for s in self.sessions)

    @property
    def turns(self) -> int:
        return sum(len(s.turns) for s in self.sessions)

    @property
    def models(self) -> list[str]:
        """The model names the recorded requests asked for."""
        return sorted(
            {
                str(t.body.get("model"))
                for s in self.sessions
                for t in s.turns
                if t.body is not None and "model" in t.body
            }
        )

    @property
    def unplayable(self) -> int:
        """Turns recorded without their body: they cannot be sent."""
        return sum(t.body is None for s in self.sessions for t in s.turns)


def _captured_turn(rec: dict[str, Any]) -> CapturedTurn | None:
    """A turn record read as a recorded request; None for a line that is no turn record."""
    session, turn, timings = rec.get("session"), rec.get("turn"), rec.get("timings")
    request = rec.get("request")
    if (
        not isinstance(session, str)
        or not isinstance(turn, int)
        or isinstance(turn, bool)
        or not isinstance(timings, dict)
        or not isinstance(request, dict)
    ):
        return None
    start = timings.get("start_wall_ns")
    if not isinstance(start, int) or isinstance(start, bool) or start <= 0:
        return None  # with no start time there is no pace to keep
    body = request.get("body")
    headers = request.get("headers")
    seed = rec.get("seed")
    return CapturedTurn(
        session=session,
        turn=turn,
        scenario=str(rec.get("scenario") or "proxy"),
        seed=seed if isinstance(seed, int) and not isinstance(seed, bool) else 0,
        start_wall_ns=start,
        body=body if isinstance(body, dict) else None,
        headers={str(k): str(v) for k, v in headers.items()} if isinstance(headers, dict) else {},
    )


def load_capture(path: Path) -> Capture:
    """Read a capture's conversations; CaptureError when there is nothing to replay."""
    run_dir = find_run_folder(path, "--replay", CaptureError)
    try:
        records, _ = read_jsonl(run_dir / TURNS_FILE)  # a torn last line (a killed proxy) is no turn
    except OSError as e:  # a folder in its place, no permission
        raise CaptureError(f"--replay {run_dir}: cannot read {TURNS_FILE} ({e.strerror or e})") from None
    by_session: dict[str, dict[int, CapturedTurn]] = {}
    for n, rec in enumerate(records, 1):
        captured = _captured_turn(rec)
        if captured is None:
            raise CaptureError(f"--replay {run_dir}: record {n} of {TURNS_FILE} is not a turn record")
        turns = by_session.setdefault(captured.session, {})
        if captured.turn in turns:
            raise CaptureError(
                f"--replay {run_dir}: session {captured.session} turn {captured.turn} is recorded twice in {TURNS_FILE}"
            )
        turns[captured.turn] = captured
    if not by_session:
        raise CaptureError(f"--replay {run_dir}: {TURNS_FILE} records no turn")
    sessions = [CapturedSession(sid, tuple(turns[i] for i in sorted(turns))) for sid, turns in by_session.items()]
    sessions.sort(key=lambda s: (s.start_wall_ns, s.session))
    capture = Capture(run_dir, tuple(sessions))
    if capture.unplayable == capture.turns:
        raise CaptureError(
            f"--replay {run_dir}: no turn keeps its request body; record the traffic with "
            "`dsv4bench proxy --capture` (without it only failing turns keep theirs)"
        )
    return capture


def replay_headers(recorded: dict[str, str], run_id: str) -> dict[str, str]:
    """The recorded headers to send again: the client's own (a server may answer by them, as the
    test servers do by the X-Dsv4bench ones), without the masked credentials (the replay's
    --api-key stands for them), the connection's own, and the capture's run tag (this run's)."""
    sent = {
        k: v
        for k, v in recorded.items()
        if v != MASK and k.lower() not in HOP_BY_HOP | _SET_BY_CLIENT and k.lower() != RUN_HEADER
    }
    return {**sent, "X-Dsv4bench-Run": run_id}


class CaptureReplay:
    """Sends a capture's conversations again and records every answer into `history`.

    `send` posts one request and reads its answer (client.chat_turn in a run); `clock` and
    `sleep` are the event loop's, given so the pacing can be tested on a clock of its own."""

    def __init__(
        self,
        capture: Capture,
        send: SendTurn,
        history: HistoryWriter,
        run_id: str,
        *,
        speed: float,
        concurrency: int,
        stats: LiveStats | None = None,
        reference: ReferenceAnswers | None = None,
        model: str | None = None,
        clock: Callable[[], float] = anyio.current_time,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
    ) -> None:
        self.capture = capture
        self.send = send
        self.history = history
        self.run_id = run_id
        self.speed = speed
        self.concurrency = concurrency
        self.stats = stats or LiveStats()
        self.reference = reference
        self.model = model
        self.clock = clock
        self.sleep = sleep

    async def run(self) -> None:
        self.stats.sessions_target = len(self.capture.sessions)
        self.history.event("run_start", run=self.run_id)
        slots = anyio.CapacityLimiter(self.concurrency)
        started = self.clock()
        async with anyio.create_task_group() as tg:
            for sess in self.capture.sessions:
                tg.start_soon(self._session, sess, started, slots)

    async def _wait_until(self, deadline: float) -> None:
        delay = deadline - self.clock()
        if delay > 0:
            await self.sleep(delay)

    async def _session(self, sess: CapturedSession, started: float, slots: anyio.CapacityLimiter) -> None:
        await self._wait_until(started + paced_offset(sess.start_wall_ns, self.capture.start_wall_ns, self.speed))
        async with slots:
            begun = self.clock()
            self.history.event("session_start", session=sess.session, scenario=sess.scenario, seed=sess.seed)
            self.stats.sessions_active += 1
            played = 0
            try:
                for captured in sess.turns:
                    await self._wait_until(begun + paced_offset(captured.start_wall_ns, sess.start_wall_ns, self.speed))
                    if captured.body is None:
                        self.history.event(
                            "replay_unplayable",
                            session=sess.session,
                            turn=captured.turn,
                            reason="the capture kept no request body for this turn",
                        )
                        continue
                    await self._turn(captured, captured.body)
                    played += 1
            finally:
                self.stats.sessions_active -= 1
                self.stats.sessions_done += 1
                self.history.event("session_end", session=sess.session, reason="replayed", turns=played, tool_calls=0)

    async def _turn(self, captured: CapturedTurn, recorded: dict[str, Any]) -> None:
        body = recorded if self.model is None else {**recorded, "model": self.model}
        outcome = await self.send(body, replay_headers(captured.headers, self.run_id))
        ctx = request_context(body, outcome)
        summary = client_request_summary(body)
        if self.reference is not None and "key" in summary:  # only greedy requests are keyed there
            ctx.reference = self.reference.get(summary["key"])
        verdicts, check_errors = run_checks(ctx)
        if ctx.reference is not None and outcome.status is TurnStatus.OK:
            summary["compared"] = True  # the capture got an answer to this same request: judged against it
        failing = keeps_evidence(outcome.status, verdicts, check_errors)
        if failing:
            summary["body"] = body  # the exact request, so the turn can be replayed and audited
        where = (self.run_id, captured.session, captured.turn, captured.scenario, captured.seed)
        rec = outcome_record(*where, outcome, summary, verdicts, check_errors, failing)
        self.history.turn(rec)
        self.stats.add_turn(rec)


def run_replay(
    config: RunConfig,
    facts: dict[str, Any],
    command: str,
    capture: Capture,
    speed: float,
    reference: ReferenceAnswers | None = None,
) -> tuple[dict[str, Any], Path]:
    """Replay `capture` against config's server into a new run folder under config.out, then
    write its report. Returns (summary, run dir)."""
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_id = f"{stamp}-replay-c{config.concurrency}-{secrets.token_hex(2)}"
    run_dir = config.out / run_id
    settings = {k: v for k, v in config.to_json().items() if k in REPLAY_SETTINGS}
    settings.update(
        replay=str(capture.run_dir),
        speed="max" if speed == SPEED_MAX else speed,
        reference=str(reference.run_dir) if reference is not None else None,
    )
    run_info: dict[str, Any] = {
        "run": run_id,
        "command": command,
        "config": settings,
        "model": config.model or ", ".join(capture.models) or "as recorded",
        "server": facts,
        "started": dt.datetime.now(dt.timezone.utc).isoformat(),
        "replay": {
            "capture": str(capture.run_dir),
            "sessions": len(capture.sessions),
            "turns": capture.turns,
            "unplayable": capture.unplayable,
        },
    }
    if reference is not None:
        run_info["reference"] = {
            "run_dir": str(reference.run_dir),
            "answers": len(reference.answers),
            "conflicts": reference.conflicts,
        }
    history = HistoryWriter(run_dir, run_info, config.redactor)
    stats = LiveStats()
    url = f"{config.base_url}/chat/completions"
    deadlines = config.deadlines

    async def replay() -> None:
        async with make_client(config) as client:  # one pooled client for the run, as `agents` has

            async def send(body: dict[str, Any], headers: dict[str, str]) -> TurnOutcome:
                return await chat_turn(client, url, body, deadlines, headers)

            await CaptureReplay(
                capture,
                send,
                history,
                run_id,
                speed=speed,
                concurrency=config.concurrency,
                stats=stats,
                reference=reference,
                model=config.model,
            ).run()

    reason = RunEndReason.COMPLETE
    try:
        with ProgressView(stats, config.quiet):
            fair_loop.run(replay)
    except KeyboardInterrupt:
        reason = RunEndReason.INTERRUPTED  # the history so far is kept and reported
    except BaseException:
        reason = RunEndReason.ERROR
        raise
    finally:
        history.event("run_end", run=run_id, reason=reason)
        history.close()
    return build_report(run_dir), run_dir
