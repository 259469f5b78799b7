"""History files: append-only, flushed per record, readable after a torn write."""

import json

import pytest

from dsv4bench.history import HistoryError, HistoryWriter, read_history
from dsv4bench.records import AssembledResponse, Timings, ToolCall, TurnRecord, TurnStatus, Verdict


def record(i, status=TurnStatus.OK, verdicts=()):
    return TurnRecord(run="r", session=f"s{i}", turn=0, scenario="coding", seed=i, status=status,
                      timings=Timings(start_wall_ns=1, start_ns=2, first_token_ns=5, end_ns=9, token_gaps_ms=[1.5]),
                      response=AssembledResponse(response_id=f"id{i}", content="c",
                                                 tool_calls=[ToolCall(0, "c0", "f", "{}")], finish_reason="tool_calls"),
                      verdicts=list(verdicts))


def test_round_trip_and_flush_per_record(tmp_path):
    w = HistoryWriter(tmp_path / "run", {"run": "r", "command": "dsv4bench agents"})
    w.turn(record(1, verdicts=[Verdict("schema_violation", "bad", "tool_calls[0]")]))
    w.event("kill", session="s1")
    # Visible to a reader before close: nothing waits in a user-space buffer.
    lines = (tmp_path / "run" / "turns.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["response_id"] == "id1"
    h = read_history(tmp_path / "run")
    assert h.turns[0].verdicts == [Verdict("schema_violation", "bad", "tool_calls[0]")]
    assert h.turns[0].timings.ttft_s == pytest.approx(3e-9)
    assert h.turns[0].corrupt and h.events[0]["kind"] == "kill" and not h.complete
    w.close()


def test_torn_last_line_is_skipped(tmp_path):
    w = HistoryWriter(tmp_path, {"run": "r"})
    w.turn(record(1))
    w.turn(record(2, status=TurnStatus.KILLED))
    w.close()
    with open(tmp_path / "turns.jsonl", "a") as f:
        f.write(json.dumps(record(3).to_json())[:57])  # SIGKILL mid-write
    h = read_history(tmp_path)
    assert [t.session for t in h.turns] == ["s1", "s2"] and h.skipped_lines == 1
    assert not h.turns[1].corrupt


def test_not_a_run_folder(tmp_path):
    with pytest.raises(HistoryError):
        read_history(tmp_path)
    with pytest.raises(HistoryError):
        read_history(tmp_path / "missing")
