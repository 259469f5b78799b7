"""events.jsonl's shape, held against a golden list (other tools read these names, so a kind or a
field renamed or dropped fails here by name), each kind written through HistoryWriter and read
back through the codec, and what happens to a kind or field events.py does not declare."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from dsv4bench.history.events import (
    EVENT_TYPES,
    STRICT_ENV,
    Kill,
    RunEndReason,
    decode_event,
)
from dsv4bench.history.redact import MASK, Redactor
from dsv4bench.history.run_folder import EVENTS_FILE, HistoryWriter, history_gaps, read_history

# Each kind's fields, in the order written, after t_wall_ns, t_ns, kind (and `worker`, on events a
# Locust worker sent). A new kind: its line here and its record in events.py.
EVENT_FIELDS = {
    "run_start": ["run"],
    "run_end": ["run", "reason", "turns_recorded", "write_failures", "ascii_escaped_records"],
    "harness_clock": [
        "tick_s",
        "stall_s",
        "ticks",
        "lag_p50_ms",
        "lag_p99_ms",
        "lag_max_ms",
        "stalls",
        "stalled_s",
        "longest_stall_s",
    ],
    "history_write_error": ["file", "session", "turn", "error"],
    "wedge_error": ["error"],
    "recover_start": ["cmd"],
    "recover_end": ["cmd", "exit_code", "output_tail", "cmd_s", "healthy_after_s"],
    "session_start": ["session", "scenario", "seed", "attempt"],
    "session_end": ["session", "reason", "turns", "tool_calls"],
    "session_restart": ["session", "new_session", "attempt", "spec"],
    "kill": ["spec", "sessions", "who", "abort", "restart", "at_s", "users", "reason"],
    "abort_request": ["spec", "results"],
    "load_stopped": ["drain_timeout_s"],
    "drain_end": ["reason", "drain_s"],
    "health": ["endpoint", "result", "latency_s", "status", "error", "role"],
    "canary": ["ok", "endpoint", "result", "latency_s", "error", "http_status", "stream", "first_chunk_s", "role"],
    "canary_skipped": ["endpoint", "role", "reason"],
    "api_key_hosts": ["key_sent_to", "key_withheld_from", "key_to_workers"],
    "raw_not_offered": ["family", "server", "reason"],
    "alone_start": ["stage"],
    "cache_flush": ["path", "flushed", "detail"],
    "alone_request": ["purpose", "session", "turn", "key", "status", "error", "codes", "ms"],
    "alone_end": ["requests", "elapsed_s", "error"],
    "persistence_start": ["sessions"],
    "persistence_session": ["fresh", "replays", "outcome"],
    "persistence_end": ["poisoned"],
    "persistence_skipped": ["reason"],
    "persistence_error": ["error"],
    "unaudited_request": ["path", "reason", "bytes"],
    "path_refused": ["status", "path"],
    "request_too_large": ["status", "bytes_seen", "max_body", "declared"],
    "request_timeout": ["status", "bytes_seen"],
    "events_suppressed": ["refusal", "count"],
    "upstream_keepalive": ["keepalive_s", "server_idle_s", "how", "applied"],
    "replay_unplayable": ["session", "turn", "reason"],
    "host_changed": ["host", "command_line_host", "key_sent", "key_given"],
    "worker_lost": [],
    "worker_recorded": ["worker_index", "turns", "codes"],
    "turn_lost": ["session", "turn", "reason"],
}
BASE_FIELDS = ["t_wall_ns", "t_ns", "worker"]
END_REASONS = ["complete", "duration", "interrupted", "error", "serve_metrics_port_taken"]

# One event of each kind as its writer sends it (call sites in harness/, modes/, locust/).
SAMPLES: dict[str, dict] = {
    "run_start": {"run": "r1"},
    "run_end": {"run": "r1", "reason": "complete"},
    "harness_clock": {
        "tick_s": 0.05,
        "stall_s": 0.25,
        "ticks": 12,
        "lag_p50_ms": 0.4,
        "lag_p99_ms": None,
        "lag_max_ms": 3.0,
        "stalls": 0,
        "stalled_s": 0.0,
        "longest_stall_s": 0.0,
    },
    "history_write_error": {"file": "turns.jsonl", "session": "s1", "turn": 2, "error": "OSError: disk full"},
    "wedge_error": {"error": "ValueError: boom"},
    "recover_start": {"cmd": "systemctl restart sglang"},
    "recover_end": {"cmd": "x", "exit_code": 0, "output_tail": "", "cmd_s": 1.5, "healthy_after_s": None},
    "session_start": {"session": "s00001", "scenario": "coding", "seed": 7, "attempt": 0},
    "session_end": {"session": "s00001", "reason": "final", "turns": 4, "tool_calls": 3},
    "session_restart": {"session": "s00001", "new_session": "s00001.r1", "attempt": 1, "spec": "at:5s:restart"},
    "kill": {"spec": "every:10s", "sessions": ["s1"], "who": "all", "abort": False, "restart": False},
    "abort_request": {"spec": "at:5s:abort", "results": {"rid-1": 200, "rid-2": "ConnectError"}},
    "load_stopped": {"t_ns": 123, "drain_timeout_s": 0},
    "drain_end": {"reason": "queues_empty", "drain_s": 0.5},
    "health": {
        "t_ns": 5,
        "endpoint": "http://h/health",
        "result": "ok",
        "latency_s": 0.01,
        "status": 200,
        "error": None,
    },
    "canary": {
        "ok": True,
        "t_ns": 6,
        "endpoint": "http://h/v1",
        "result": "ok",
        "latency_s": 0.2,
        "error": None,
        "http_status": 200,
        "stream": True,
        "first_chunk_s": 0.1,
        "role": "unified",
    },
    "canary_skipped": {"endpoint": "http://h/v1", "role": "prefill", "reason": "it takes no chat"},
    "api_key_hosts": {"key_sent_to": ["http://h:80"], "key_withheld_from": [], "key_to_workers": False},
    "raw_not_offered": {"family": "qwen", "server": "http://h/v1", "reason": "no /tokenize"},
    "alone_start": {"stage": "recheck"},
    "cache_flush": {"path": "/flush_cache", "flushed": True, "detail": "/flush_cache: HTTP 200"},
    "alone_request": {
        "purpose": "finding",
        "session": "s1",
        "turn": 3,
        "key": "ab12",
        "status": "ok",
        "error": None,
        "codes": ["dsml_leak"],
        "ms": 41.5,
    },
    "alone_end": {"requests": 2, "elapsed_s": 1.25, "error": None},
    "persistence_start": {"sessions": 3},
    "persistence_session": {"fresh": "p1", "replays": "s00002", "outcome": "clean"},
    "persistence_end": {"poisoned": False},
    "persistence_skipped": {"reason": "no session was clean"},
    "persistence_error": {"error": "RuntimeError: x"},
    "unaudited_request": {"path": "/v1/chat/completions", "reason": "body is not a JSON object", "bytes": 3},
    "path_refused": {"status": 400, "path": "/v1/../x"},
    "request_too_large": {"status": 413, "bytes_seen": 9000, "max_body": 8000, "declared": True},
    "request_timeout": {"status": 408, "bytes_seen": 10},
    "events_suppressed": {"refusal": "path_refused", "count": 480},
    "upstream_keepalive": {"keepalive_s": 4.0, "server_idle_s": 5.0, "how": "closed", "applied": True},
    "replay_unplayable": {"session": "s1", "turn": 0, "reason": "the capture kept no request body for this turn"},
    "host_changed": {"host": "http://b", "command_line_host": "http://a", "key_sent": False, "key_given": True},
    "worker_lost": {"worker": "node-1"},
    "worker_recorded": {"worker": "node-1", "worker_index": 0, "turns": 5, "codes": {"dsml_leak": 1}},
    "turn_lost": {"worker": "node-1", "session": "s1", "turn": 2, "reason": "its worker stopped answering the master"},
}


def test_each_kind_keeps_its_field_names() -> None:
    assert set(EVENT_TYPES) == set(EVENT_FIELDS), (
        f"kinds gone {sorted(set(EVENT_FIELDS) - set(EVENT_TYPES))}, new {sorted(set(EVENT_TYPES) - set(EVENT_FIELDS))}"
    )
    for kind, cls in EVENT_TYPES.items():
        fields = list(cls.__struct_fields__)
        assert fields[:3] == BASE_FIELDS, f"{kind}: the common fields are now {fields[:3]}"
        assert fields[3:] == EVENT_FIELDS[kind], f"{kind}: fields now {fields[3:]}, were {EVENT_FIELDS[kind]}"


def test_end_reasons_keep_their_spellings() -> None:
    assert [r.value for r in RunEndReason] == END_REASONS


def written_events(tmp_path: Path, kinds: list[str], redactor: Redactor | None = None) -> list[bytes]:
    w = HistoryWriter(tmp_path, {"run": "r1"}, redactor)
    for kind in kinds:
        assert w.event(kind, **SAMPLES[kind]), kind
    w.close()
    return (tmp_path / EVENTS_FILE).read_bytes().splitlines()


def test_every_kind_is_written_as_its_writer_sent_it_and_reads_back(tmp_path: Path) -> None:
    assert set(SAMPLES) == set(EVENT_TYPES)
    lines = written_events(tmp_path, list(SAMPLES))
    for kind, line in zip(SAMPLES, lines):
        obj = json.loads(line)
        sent = {k: v for k, v in SAMPLES[kind].items() if k != "t_ns"}
        assert list(obj)[:3] == ["t_wall_ns", "t_ns", "kind"] and obj["kind"] == kind
        assert {k: obj[k] for k in sent} == sent, kind  # the writer's values, `worker` included
        extra = set(obj) - {"t_wall_ns", "t_ns", "kind"} - set(sent)
        assert extra <= ({"turns_recorded", "write_failures", "ascii_escaped_records"} if kind == "run_end" else set())
        if "t_ns" in SAMPLES[kind]:  # the moment it is about, not when it was written
            assert obj["t_ns"] == SAMPLES[kind]["t_ns"]
        event = decode_event(line)
        assert event is not None and type(event) is EVENT_TYPES[kind], kind
        assert json.loads(msgspec.json.encode(event)) == obj  # the codec reads back what it wrote
    assert read_history(tmp_path).events == [json.loads(line) for line in lines]


def test_run_end_carries_the_record_counts_and_the_history_is_whole(tmp_path: Path) -> None:
    lines = written_events(tmp_path, ["run_start", "run_end"])
    end = decode_event(lines[-1])
    assert end is not None and end.reason is RunEndReason.COMPLETE
    assert json.loads(lines[-1])["write_failures"] == {
        "turns.jsonl": 0,
        "events.jsonl": 0,
        "metrics.jsonl": 0,
        "run.json": 0,
    }
    assert history_gaps(read_history(tmp_path)) == []


def test_fields_a_kind_leaves_out_are_not_written(tmp_path: Path) -> None:
    """A Locust kill storm's kill says when and how many users; agents' says whom: neither gets
    the other's fields as nulls, and an event no worker sent has no `worker`."""
    w = HistoryWriter(tmp_path, {"run": "r1"})
    w.event("kill", spec="kill-storm", at_s=5.0, users=8, sessions=[])
    w.event("kill", **SAMPLES["kill"])
    w.close()
    storm, nemesis = (json.loads(x) for x in (tmp_path / EVENTS_FILE).read_bytes().splitlines())
    assert list(storm)[3:] == ["spec", "sessions", "at_s", "users"]
    assert list(nemesis)[3:] == ["spec", "sessions", "who", "abort", "restart"]


def test_a_record_can_be_written_as_a_struct(tmp_path: Path) -> None:
    w = HistoryWriter(tmp_path, {"run": "r1"})
    assert w.record(Kill(spec="every:10s", sessions=["s1", "s2"]))
    w.close()
    (event,) = read_history(tmp_path).events
    assert event["kind"] == "kill" and event["sessions"] == ["s1", "s2"] and event["t_wall_ns"] > 0


def test_secrets_are_masked_in_events(tmp_path: Path) -> None:
    secret = "sk-live-0123456789abcdef"
    w = HistoryWriter(tmp_path, {"run": "r1"}, Redactor([secret]))
    w.event("wedge_error", error=f"401 for Bearer {secret}")
    w.event("history_write_error", error=f"{secret}", file="turns.jsonl")
    w.close()
    text = (tmp_path / EVENTS_FILE).read_text()
    assert secret not in text and MASK in text


def test_a_lone_surrogate_in_an_event_reads_back_as_itself(tmp_path: Path) -> None:
    w = HistoryWriter(tmp_path, {"run": "r1"})
    w.event("wedge_error", error="bad \udc80 byte")
    w.close()
    assert (tmp_path / EVENTS_FILE).read_bytes().isascii()
    assert read_history(tmp_path).events[0]["error"] == "bad \udc80 byte"
    assert w.events.escaped == 1


@pytest.mark.parametrize(
    ("kind", "fields", "named"),
    [
        ("turn_note", {"note": "x"}, "turn_note"),
        ("kill", {"spec": "x", "sessions": [], "session": "s1"}, "session"),
        ("run_end", {"run": "r1"}, "reason"),
    ],
)
def test_a_kind_or_field_events_py_does_not_declare_fails_by_name_in_the_tests(
    tmp_path: Path, kind: str, fields: dict, named: str
) -> None:
    w = HistoryWriter(tmp_path, {"run": "r1"})
    with pytest.raises(TypeError, match=named):
        w.event(kind, **fields)
    w.close()


def test_a_value_of_the_wrong_type_fails_in_the_tests(tmp_path: Path) -> None:
    w = HistoryWriter(tmp_path, {"run": "r1"})
    with pytest.raises(TypeError, match="reason"):
        w.event("run_end", run="r1", reason="finished")  # no RunEndReason
    w.close()


def test_outside_the_tests_such_an_event_is_still_written_as_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug of ours must not lose a record of the run: the event is written untyped."""
    monkeypatch.delenv(STRICT_ENV)
    w = HistoryWriter(tmp_path, {"run": "r1"})
    assert w.event("turn_note", session="s1", note="x")
    assert w.event("run_end", run="r1")
    w.close()
    note, end = read_history(tmp_path).events
    assert note["kind"] == "turn_note" and note["note"] == "x"
    assert end["turns_recorded"] == 0 and "reason" not in end


@pytest.mark.parametrize(
    "line",
    [
        b'{"kind":"run_end","run":"r"',  # torn
        b'{"kind":"turn_note","t_wall_ns":1}',  # a kind this version does not know
        b'{"kind":"run_end","run":"r","reason":"finished"}',  # a reason outside RunEndReason
        b'{"kind":"session_end","session":"s","reason":"final","turns":"four","tool_calls":0}',
        b'{"t_wall_ns":1,"t_ns":2}',  # no kind
        b"[1, 2]",
        b"",
    ],
)
def test_decode_event_gives_none_for_a_line_that_is_no_record(line: bytes) -> None:
    assert decode_event(line) is None
