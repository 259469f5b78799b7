"""The proxy's audit in a worker process (modes/proxy_audit.py): what the worker makes of the
steps the forwarding process stamps, and what happens when either side goes away."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import httpx
import pytest

from dsv4bench.history.records import TurnStatus
from dsv4bench.history.run_folder import read_history
from dsv4bench.modes import proxy_audit
from dsv4bench.modes.proxy import AuditProxy, build_app
from dsv4bench.modes.proxy_audit import WORKER_NICE, WorkerAudit, _Worker

from .test_proxy import Served, body, upstream  # noqa: F401 - the fake upstream, as a fixture

HEADERS = [(b"content-type", b"application/json")]
SSE = [(b"content-type", b"text/event-stream")]


def sse(delta: dict, finish: str | None = None) -> bytes:
    chunk = {
        "id": "c",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return f"data: {json.dumps(chunk)}\n\n".encode()


def worker(tmp_path: Path) -> _Worker:
    config = {"out": str(tmp_path), "run_id": "r1", "run_info": {"command": "t", "config": {}}}
    return _Worker({**config, "api_key": None, "capture": False, "quiet": True})


def request(stream: bool = True) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}).encode()


def test_a_turns_timings_are_the_forwarding_stamps_not_the_workers(tmp_path):
    w = worker(tmp_path)
    w.apply(("open", 1, "/v1/chat/completions", HEADERS, request(), "10.0.0.1", 1_700_000_000_000_000_000, 1_000))
    w.apply(("started", 1, 200, SSE, 2_000))
    w.apply(("chunk", 1, sse({"role": "assistant", "content": "Hel"}), 3_000))
    w.apply(("chunk", 1, sse({"content": "lo"}) + sse({}, "stop") + b"data: [DONE]\n\n", 5_000))
    w.apply(("ended", 1, 6_000))
    w.apply(("close", 1, 7_000))
    w.finish("complete")
    (turn,) = read_history(tmp_path / "r1").turns
    t = turn.timings
    assert (t.start_wall_ns, t.start_ns, t.first_byte_ns, t.first_token_ns, t.end_ns) == (
        1_700_000_000_000_000_000,
        1_000,
        2_000,
        3_000,
        7_000,
    )
    assert t.token_gaps_ms == [0.002]  # 3,000 ns to 5,000 ns
    assert turn.status is TurnStatus.OK and turn.response.content == "Hello" and turn.session == "10.0.0.1"


def test_an_answer_the_audit_fell_behind_on_is_never_judged(tmp_path):
    """Chunks dropped for the backlog leave a stream that looks cut: the worker's gap, not the
    server's, so the turn carries a check error and no verdict (a whole stream is judged as ever)."""
    w = worker(tmp_path)
    for h in (1, 2):
        w.apply(("open", h, "/v1/chat/completions", HEADERS, request(), None, time.time_ns(), 1))
        w.apply(("started", h, 200, SSE, 2))
        w.apply(("chunk", h, sse({"role": "assistant", "content": "Hel"}), 3))
    w.apply(("behind", 1))
    for h in (1, 2):
        w.apply(("ended", h, 4))  # neither sent [DONE]: 2 is a truncated stream, 1 is unknown
        w.apply(("close", h, 5))
    w.finish("complete")
    turns = {t.session: t for t in read_history(tmp_path / "r1").turns}
    behind, cut = sorted(read_history(tmp_path / "r1").turns, key=lambda t: t.turn)
    assert behind.verdicts == [] and any("fell" in e and "behind" in e for e in behind.check_errors)
    assert "truncated" in {v.code for v in cut.verdicts} and not cut.check_errors
    assert turns  # both recorded


def test_the_backlog_drops_an_exchanges_chunks_once_and_says_so(tmp_path, monkeypatch):
    audit = WorkerAudit.__new__(WorkerAudit)  # the gathering alone: no process, no pipe
    steps: list[tuple] = []
    audit.dead, audit._out, audit._behind = None, bytearray(), set()
    audit._put = steps.append  # type: ignore[method-assign]  # the steps kept here, not framed for a pipe
    monkeypatch.setattr(proxy_audit, "WORKER_BACKLOG", 10)
    audit.chunk(1, b"x" * 8)
    audit._out += b"x" * 10  # the pipe took nothing: 10 bytes wait, not over 10 yet
    audit.chunk(1, b"x" * 8)
    audit._out += b"x"  # 11 waiting: behind
    audit.chunk(1, b"y")
    audit.chunk(1, b"z")
    audit.chunk(2, b"w")
    audit._out.clear()  # the pipe took it all: an exchange already behind stays so, a new one is read
    audit.chunk(2, b"v")
    audit.chunk(3, b"u")
    assert [s[0] for s in steps] == ["chunk", "chunk", "behind", "behind", "chunk"]
    assert steps[2] == ("behind", 1) and steps[3] == ("behind", 2) and steps[4][:3] == ("chunk", 3, b"u")


def test_a_proxy_that_dies_leaves_a_history_closed_as_interrupted(tmp_path):
    audit = WorkerAudit(tmp_path, {"command": "t", "config": {}}, None, capture=False, quiet=True)

    async def one_turn() -> None:  # told from a loop, as the serving loop tells it
        h = audit.open("/v1/chat/completions", HEADERS, request(stream=False), None)
        audit.started(h, 200, HEADERS)
        audit.ended(h)
        audit.close(h)
        await asyncio.sleep(0.05)  # a pass of the loop: the frame goes

    asyncio.run(one_turn())
    deadline = time.monotonic() + 20
    while not (audit.run_dir / "turns.jsonl").exists() or not read_history(audit.run_dir).turns:
        assert time.monotonic() < deadline, "the worker recorded nothing"
        time.sleep(0.05)
    audit.proc.stdin.close()  # as the proxy's death closes it: no end step ever comes
    assert audit.proc.wait(20) == 0
    history = read_history(audit.run_dir)
    ends = [e for e in history.events if e["kind"] == "run_end"]
    assert len(history.turns) == 1 and [e["reason"] for e in ends] == ["interrupted"]


@pytest.mark.skipif(not hasattr(os, "getpriority"), reason="process priorities are POSIX")
def test_the_worker_runs_below_the_forwarding_in_priority(tmp_path):
    audit = WorkerAudit(tmp_path, {"command": "t", "config": {}}, None, capture=False, quiet=True)
    try:
        expect = min(19, os.getpriority(os.PRIO_PROCESS, 0) + WORKER_NICE)
        deadline = time.monotonic() + 20
        while os.getpriority(os.PRIO_PROCESS, audit.proc.pid) != expect:  # set as the worker starts
            assert time.monotonic() < deadline, "the worker kept the proxy's priority"
            time.sleep(0.05)
        assert os.getpriority(os.PRIO_PROCESS, 0) < expect  # the forwarding's own is untouched
    finally:
        audit.proc.stdin.close()
        audit.proc.wait(20)


def test_a_worker_that_dies_costs_the_history_never_the_clients_bytes(upstream, tmp_path, capsys):  # noqa: F811 - `upstream` is test_proxy's fixture, imported for use
    fake, up = upstream
    audit = WorkerAudit(tmp_path, {"command": "t", "config": {}}, None, capture=False, quiet=True)
    proxy = Served(build_app(AuditProxy(f"{up.url}/v1", audit)))
    try:
        audit.proc.kill()
        audit.proc.wait(10)
        with httpx.Client(timeout=10, trust_env=False) as c:
            for _ in range(3):
                r = c.post(f"{proxy.url}/v1/chat/completions", json=body())
                assert r.status_code == 200 and b"[DONE]" in r.content
    finally:
        proxy.stop()
        audit.end("complete")
    assert audit.dead is not None
    assert "the audit worker stopped" in capsys.readouterr().err


def test_the_proxy_serves_with_its_startup_heap_frozen():
    import gc

    from dsv4bench.cli.proxy import startup_heap_frozen

    assert gc.get_freeze_count() == 0
    with startup_heap_frozen():
        assert gc.get_freeze_count() > 1000  # the imports and all: no full collection walks them
    assert gc.get_freeze_count() == 0  # as it was, for the report built after
