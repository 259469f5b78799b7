"""History files: append-only, flushed per record, readable after a torn write."""

import json

import pytest

from dsv4bench.servers.canary import CanaryResult, HealthResult
from dsv4bench.history.run_folder import HistoryError, HistoryWriter, history_gaps, read_history
from dsv4bench.servers.monitor import MetricSample
from dsv4bench.history.records import AssembledResponse, Timings, ToolCall, TurnRecord, TurnStatus, Verdict
from dsv4bench.servers.wedge import WedgeFinding


def record(i, status=TurnStatus.OK, verdicts=()):
    return TurnRecord(
        run="r",
        session=f"s{i}",
        turn=0,
        scenario="coding",
        seed=i,
        status=status,
        timings=Timings(start_wall_ns=1, start_ns=2, first_token_ns=5, end_ns=9, token_gaps_ms=[1.5]),
        response=AssembledResponse(
            response_id=f"id{i}", content="c", tool_calls=[ToolCall(0, "c0", "f", "{}")], finish_reason="tool_calls"
        ),
        verdicts=list(verdicts),
    )


def test_round_trip_and_flush_per_record(tmp_path):
    w = HistoryWriter(tmp_path / "run", {"run": "r", "command": "dsv4bench agents"})
    w.turn(record(1, verdicts=[Verdict("schema_violation", "bad", "tool_calls[0]")]))
    w.event("kill", spec="every:10s", sessions=["s1"])
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


def test_a_lone_surrogate_is_written_and_read_back_as_itself(tmp_path):
    w = HistoryWriter(tmp_path, {"run": "r", "model": "m\ud800"})
    rec = record(1)
    rec.response.content = "a\ud800b\x00c"
    assert w.turn(rec)
    w.turn(record(2))
    w.event("run_end", run="r", reason="complete")
    w.close()
    h = read_history(tmp_path)
    assert h.turns[0].response.content == "a\ud800b\x00c" and h.turns[1].response.content == "c"
    assert h.run["model"] == "m\ud800"
    end = h.events[-1]
    assert end["turns_recorded"] == 2 and end["ascii_escaped_records"] == 1
    assert not any(end["write_failures"].values()) and history_gaps(h) == []
    # Only the record that needed it is ASCII-escaped; the others keep their UTF-8 text.
    w2 = HistoryWriter(tmp_path / "utf8", {"run": "r"})
    rec = record(3)
    rec.response.content = "日本"
    w2.turn(rec)
    w2.close()
    assert "日本" in (tmp_path / "utf8" / "turns.jsonl").read_text(encoding="utf-8")


def test_a_failed_write_is_counted_never_raised_and_makes_the_history_incomplete(tmp_path):
    w = HistoryWriter(tmp_path, {"run": "r"})
    w.turn(record(1))
    rec = record(2)
    loop: dict = {}
    loop["self"] = loop
    rec.request = loop  # not JSON: a circular reference
    assert w.turn(rec) is False
    w.metrics.close()
    assert w.metrics.write({"endpoint": "x"}) is False  # a closed file: counted too
    w.event("run_end", run="r", reason="complete")
    w.close()
    h = read_history(tmp_path)
    kinds = [e["kind"] for e in h.events]
    assert kinds == ["history_write_error", "run_end"]
    assert h.events[-1]["write_failures"] == {"turns.jsonl": 1, "events.jsonl": 0, "metrics.jsonl": 1, "run.json": 0}
    assert "could not write" in history_gaps(h)[0]


def test_gaps_fewer_turns_than_run_end_or_session_end_counted(tmp_path):
    w = HistoryWriter(tmp_path, {"run": "r"})
    for i in (1, 2, 3):
        w.turn(record(i))
    w.event("session_end", session="s1", reason="final", turns=1, tool_calls=0)
    w.event("session_end", session="s9", reason="final", turns=2, tool_calls=0)  # two turns of s9, none recorded
    w.event("run_end", run="r", reason="complete")
    w.close()
    lines = (tmp_path / "turns.jsonl").read_text().splitlines()
    (tmp_path / "turns.jsonl").write_text("\n".join(lines[:2]) + "\n")
    gaps = history_gaps(read_history(tmp_path))
    assert gaps == [
        "the run wrote 3 turn records; 2 can be read back",
        "session s9 ended after 2 turns but 0 are recorded",
    ]


def test_torn_tail_of_a_killed_run_is_partial_not_a_gap_but_a_torn_middle_is(tmp_path):
    w = HistoryWriter(tmp_path, {"run": "r"})
    for i in (1, 2):
        w.turn(record(i))
    w.close()
    text = (tmp_path / "turns.jsonl").read_text()
    torn = json.dumps(record(3).to_json())[:57]
    (tmp_path / "turns.jsonl").write_text(text + torn)
    h = read_history(tmp_path)
    assert not h.complete and h.torn_tail == {"turns.jsonl"} and history_gaps(h) == []
    (tmp_path / "turns.jsonl").write_text(torn + "\n" + text)
    assert history_gaps(read_history(tmp_path)) == ["1 unreadable line(s) in turns.jsonl"]
    # A finished run leaves no torn line: there the last one is a lost record too.
    (tmp_path / "turns.jsonl").write_text(text + torn)
    (tmp_path / "events.jsonl").write_text(json.dumps({"kind": "run_end", "t_wall_ns": 1, "t_ns": 1}) + "\n")
    assert history_gaps(read_history(tmp_path)) == ["1 unreadable line(s) in turns.jsonl"]


def test_the_server_checks_keep_their_record_keys_and_order():
    """metrics.jsonl, the health / canary events and run.json's wedge hold these very records."""

    def same(record: dict, literal: dict) -> bool:
        return list(record.items()) == list(literal.items())

    assert same(
        MetricSample(1, 2, "http://s/metrics", True, values={"g": 3.0}).as_dict(),
        {"t_wall_ns": 1, "t_ns": 2, "endpoint": "http://s/metrics", "values": {"g": 3.0}, "ok": True},
    )
    assert same(
        MetricSample(1, 2, "http://s/metrics", False, error="ConnectError: refused").as_dict(),
        {"t_wall_ns": 1, "t_ns": 2, "endpoint": "http://s/metrics", "ok": False, "error": "ConnectError: refused"},
    )
    assert same(
        HealthResult(2, "http://s/health", "failing", 0.1, status=503).as_dict(),
        {"t_ns": 2, "endpoint": "http://s/health", "result": "failing", "latency_s": 0.1, "status": 503, "error": None},
    )
    canary = CanaryResult(2, "http://s/v1", "timeout", 1.0, "timeout after 1 s")
    assert same(
        canary.as_dict(),
        {
            "ok": False,
            "t_ns": 2,
            "endpoint": "http://s/v1",
            "result": "timeout",
            "latency_s": 1.0,
            "error": "timeout after 1 s",
            "http_status": None,
            "stream": False,
            "first_chunk_s": None,
        },
    )
    assert same(WedgeFinding().as_dict(), {"codes": [], "gauges": {}, "drain_s": None, "details": []})
    found = WedgeFinding(["canary_timeout"], {"g": 0.0}, 1.5, ["d", "e"], ["e"], canary)
    assert same(
        found.as_dict(),
        {
            "codes": ["canary_timeout"],
            "gauges": {"g": 0.0},
            "drain_s": 1.5,
            "details": ["d", "e"],
            "check_errors": ["e"],
            "canary": {
                "ok": False,
                "result": "timeout",
                "http_status": None,
                "latency_s": 1.0,
                "error": "timeout after 1 s",
            },
        },
    )
