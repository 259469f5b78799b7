"""`agents --replay` without a server: a hand-made capture read back in conversation order, its
requests sent on a virtual clock (so the pacing arithmetic is checked exactly, not timed),
turns without a body counted, and a folder that cannot be replayed one line at the CLI."""

from __future__ import annotations

import heapq
import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from typer.testing import CliRunner

from dsv4bench.cli import app
from tests.cli_output import assert_one_line_exit_2
from dsv4bench.history.run_folder import HistoryWriter, read_history
from dsv4bench.history.records import AssembledResponse, Timings, TurnStatus
from dsv4bench.history.redact import MASK
from dsv4bench.modes.replay import (
    CaptureError,
    CaptureReplay,
    load_capture,
    paced_offset,
    parse_speed,
    replay_headers,
)
from dsv4bench.wire.turn_answer import TurnOutcome

S = 1_000_000_000  # ns per second
T0 = 1_700_000_000 * S  # the capture's first request, wall clock


def turn_line(session: str, turn: int, start_s: float, body: bool = True) -> dict[str, Any]:
    """One turns.jsonl record as `dsv4bench proxy --capture` writes it."""
    request: dict[str, Any] = {"key": f"k-{session}-{turn}", "temperature": 0, "stream": False}
    if body:
        request["body"] = {
            "model": "m",
            "temperature": 0,
            "stream": False,
            "messages": [{"role": "user", "content": f"{session} says {turn}"}],
        }
        request["headers"] = {
            "authorization": MASK,
            "x-dsv4bench-session": session,
            "x-dsv4bench-run": "captured",
            "content-length": "99",
            "x-dsv4bench-scenario": "coding",
        }
    return {
        "run": "captured",
        "session": session,
        "turn": turn,
        "scenario": "coding",
        "seed": 7,
        "status": "ok",
        "timings": {"start_wall_ns": T0 + int(start_s * S), "start_ns": 5},
        "request": request,
        "response": None,
        "verdicts": [],
    }


def write_capture(folder: Path, lines: list[dict[str, Any]]) -> Path:
    folder.mkdir(parents=True)
    (folder / "turns.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return folder


class VirtualClock:
    """A clock that moves only when every task waits: then straight to the earliest wake-up."""

    def __init__(self) -> None:
        self.now = 0.0
        self._sleepers: list[tuple[float, int, anyio.Event]] = []
        self._n = 0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        wake = anyio.Event()
        self._n += 1
        heapq.heappush(self._sleepers, (self.now + delay, self._n, wake))
        await wake.wait()

    async def advance(self) -> None:
        while True:
            await anyio.wait_all_tasks_blocked()
            if not self._sleepers:
                return
            self.now, _, wake = heapq.heappop(self._sleepers)
            wake.set()


def replay_on(
    clock: VirtualClock,
    capture_dir: Path,
    tmp: Path,
    *,
    speed: float,
    concurrency: int,
    answer_s: dict[tuple[str, int], float],
) -> tuple[list[tuple[float, str, int]], Path]:
    """Replay a capture with answers that take answer_s (default 0.25 s) of virtual time: the
    (virtual time, session, turn) each request was sent at, and the run folder."""
    sent: list[tuple[float, str, int]] = []
    capture = load_capture(capture_dir)
    run_dir = tmp / "replayed"
    history = HistoryWriter(run_dir, {"run": "replayed"})

    async def send(body: dict[str, Any], headers: dict[str, str]) -> TurnOutcome:
        content = body["messages"][0]["content"]
        session, turn = content.split(" says ")[0], int(content.split(" says ")[1])
        sent.append((clock.now, session, turn))
        start = clock.now
        await clock.sleep(answer_s.get((session, turn), 0.25))
        return TurnOutcome(
            status=TurnStatus.OK,
            timings=Timings(start_wall_ns=T0, start_ns=int(start * S), end_ns=int(clock.now * S)),
            response=AssembledResponse(content="done", finish_reason="stop", stream=False),
            http_status=200,
        )

    async def main() -> None:
        replay = CaptureReplay(
            capture, send, history, "replayed", speed=speed, concurrency=concurrency, clock=clock, sleep=clock.sleep
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(clock.advance)
            await replay.run()

    anyio.run(main)
    history.event("run_end", run="replayed", reason="complete")
    history.close()
    return sent, run_dir


def test_a_capture_reads_back_as_conversations_in_order(tmp_path):
    capture = load_capture(
        write_capture(
            tmp_path / "cap",
            [
                turn_line("b", 1, 5.0),
                turn_line("a", 0, 0.0),
                turn_line("b", 0, 1.0),
                turn_line("a", 2, 3.0),
                turn_line("a", 1, 2.0),
            ],
        )
    )
    assert [s.session for s in capture.sessions] == ["a", "b"]  # by their recorded start
    assert [[t.turn for t in s.turns] for s in capture.sessions] == [[0, 1, 2], [0, 1]]
    assert capture.turns == 5 and capture.unplayable == 0 and capture.start_wall_ns == T0


def test_the_recorded_pace_is_divided_by_speed_and_a_turn_waits_for_the_answer_before_it(tmp_path):
    capture = write_capture(
        tmp_path / "cap",
        [
            turn_line("a", 0, 0.0),
            turn_line("a", 1, 2.0),
            turn_line("a", 2, 3.0),
            turn_line("b", 0, 1.0),
            turn_line("b", 1, 5.0),
        ],
    )
    sent, _ = replay_on(VirtualClock(), capture, tmp_path, speed=2.0, concurrency=8, answer_s={("b", 0): 3.0})
    # a: its own recorded gaps halved (0, 1, 1.5); b starts 1 s / 2 after a, and its turn 1, due
    # 2 s after its start, waits for turn 0's 3 s answer.
    assert sorted(sent) == [(0.0, "a", 0), (0.5, "b", 0), (1.0, "a", 1), (1.5, "a", 2), (3.5, "b", 1)]


def test_speed_max_sends_each_turn_once_the_previous_answer_is_in_and_concurrency_caps_sessions(tmp_path):
    capture = write_capture(
        tmp_path / "cap",
        [turn_line("a", 0, 0.0), turn_line("a", 1, 60.0), turn_line("b", 0, 30.0), turn_line("b", 1, 90.0)],
    )
    sent, run_dir = replay_on(VirtualClock(), capture, tmp_path, speed=0.0, concurrency=1, answer_s={})
    assert sent == [(0.0, "a", 0), (0.25, "a", 1), (0.5, "b", 0), (0.75, "b", 1)]
    history = read_history(run_dir)
    assert [(t.session, t.turn, t.scenario, t.seed) for t in history.turns] == [
        ("a", 0, "coding", 7),
        ("a", 1, "coding", 7),
        ("b", 0, "coding", 7),
        ("b", 1, "coding", 7),
    ]


def test_a_turn_without_its_body_is_counted_and_noted_never_sent(tmp_path):
    capture_dir = write_capture(
        tmp_path / "cap", [turn_line("a", 0, 0.0), turn_line("a", 1, 1.0, body=False), turn_line("a", 2, 2.0)]
    )
    assert load_capture(capture_dir).unplayable == 1
    sent, run_dir = replay_on(VirtualClock(), capture_dir, tmp_path, speed=0.0, concurrency=1, answer_s={})
    assert [(s, t) for _, s, t in sent] == [("a", 0), ("a", 2)]
    history = read_history(run_dir)
    assert [(e["session"], e["turn"]) for e in history.events if e["kind"] == "replay_unplayable"] == [("a", 1)]
    assert [e["turns"] for e in history.events if e["kind"] == "session_end"] == [2]


def test_the_recorded_headers_go_again_without_credentials_transport_or_the_capture_run_tag():
    sent = replay_headers(
        {
            "authorization": MASK,
            "x-api-key": MASK,
            "content-length": "12",
            "connection": "close",
            "x-dsv4bench-run": "captured",
            "x-dsv4bench-session": "s1",
            "x-dsv4bench-turn": "3",
        },
        "replayed",
    )
    assert sent == {"x-dsv4bench-session": "s1", "x-dsv4bench-turn": "3", "X-Dsv4bench-Run": "replayed"}


def test_speed_and_pace_arithmetic():
    assert parse_speed("max") == parse_speed("0") == 0.0 and parse_speed("2.5") == 2.5
    for bad in ("-1", "fast", "nan", "inf"):
        with pytest.raises(CaptureError, match="--speed"):
            parse_speed(bad)
    assert paced_offset(T0 + 3 * S, T0, 1.0) == 3.0
    assert paced_offset(T0 + 3 * S, T0, 4.0) == 0.75
    assert paced_offset(T0 + 3 * S, T0, 0.0) == 0.0
    assert paced_offset(T0 - S, T0, 1.0) == 0.0  # a clock step back never means a wait


@pytest.mark.parametrize(
    "make,needle",
    [
        (lambda tmp: tmp / "nowhere", "no such folder"),
        (lambda tmp: tmp, "not a dsv4bench run folder"),
        (lambda tmp: write_capture(tmp / "cap", []), "records no turn"),
        (lambda tmp: write_capture(tmp / "cap", [turn_line("a", 0, 0.0, body=False)]), "dsv4bench proxy --capture"),
        (lambda tmp: write_capture(tmp / "cap", [{"session": "a"}]), "is not a turn record"),
        (
            lambda tmp: write_capture(tmp / "cap", [{**turn_line("a", 0, 0.0), "timings": {}}]),
            "record 1 of turns.jsonl",
        ),
        (lambda tmp: write_capture(tmp / "cap", [turn_line("a", 0, 0.0), turn_line("a", 0, 1.0)]), "recorded twice"),
    ],
)
def test_a_folder_that_cannot_be_replayed_is_one_line_before_anything_starts(tmp_path, make, needle):
    result = CliRunner().invoke(
        app,
        ["agents", "--replay", str(make(tmp_path)), "--url", "http://127.0.0.1:1/v1", "--out", str(tmp_path / "runs")],
    )
    assert_one_line_exit_2(result, needle)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--replay", "CAP", "--scenario", "coding", "--kill", "all@3s"], "not with --scenario, --kill"),
        (["--replay", "CAP", "--sessions", "3"], "not with --sessions"),
        (["--speed", "2"], "needs --replay"),
        (["--replay", "CAP", "--speed", "fast"], "--speed"),
    ],
)
def test_flags_a_replay_cannot_honour_are_one_line(tmp_path, args, needle):
    capture = write_capture(tmp_path / "cap", [turn_line("a", 0, 0.0)])
    argv = [
        "agents",
        "--url",
        "http://127.0.0.1:1/v1",
        "--out",
        str(tmp_path / "runs"),
        *[str(capture) if a == "CAP" else a for a in args],
    ]
    assert_one_line_exit_2(CliRunner().invoke(app, argv), needle)
