"""`dsv4bench agents --replay` as a user runs it: an `agents` run captured through
`dsv4bench proxy --capture`, then replayed against the same server, reproduces the capture's
turns: the same sessions and turns, statuses and verdict codes, and (the servers being
deterministic) no reference_mismatch against the capture's own answers."""

from __future__ import annotations

import json
import shutil

from dsv4bench.engine.launcher import start_engine
from dsv4bench.history.run_folder import read_history

from .conftest import only_run_dir, run_cli
from .test_proxy import start_proxy_cli


def turn_view(t) -> tuple:
    """What a replay must reproduce of a captured turn."""
    return t.status.value, str(t.error_kind) if t.error_kind else None, sorted({v.code for v in t.verdicts})


def capture_agents(upstream: str, tmp_path, *agents_args: str):
    """An `agents` run played through `proxy --capture` in front of `upstream`: the capture's run folder."""
    proxy = start_proxy_cli(upstream, tmp_path / "capture", "--capture", "--quiet")
    try:
        agents = run_cli(
            "agents", "--url", proxy.url, "--out", str(tmp_path / "agents"), "--quiet", *agents_args, timeout=120
        )
        assert agents.returncode == 0, agents.stderr
    finally:
        rc, _, stderr = proxy.interrupt()
    assert rc == 0, stderr
    return only_run_dir(tmp_path / "capture")


def test_a_capture_replayed_against_the_replay_server_reproduces_its_turns_and_findings(fast_replay, tmp_path):
    capture = capture_agents(
        fast_replay.url, tmp_path, "--sessions", "8", "--concurrency", "4", "--max-turns", "5", "--seed", "3"
    )
    captured = read_history(capture).turns
    assert captured and all("body" in t.request and "headers" in t.request for t in captured)
    assert any(turn_view(t)[2] for t in captured), "the replay server planted no fault: nothing to reproduce"

    r = run_cli(
        "agents",
        "--replay",
        str(capture),
        "--url",
        fast_replay.url,
        "--concurrency",
        "4",
        "--speed",
        "4",
        "--reference",
        str(capture),
        "--out",
        str(tmp_path / "replayed"),
        "--quiet",
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    run_dir = only_run_dir(tmp_path / "replayed")
    replayed = read_history(run_dir)
    assert {(t.session, t.turn): turn_view(t) for t in replayed.turns} == {
        (t.session, t.turn): turn_view(t) for t in captured
    }
    assert all(
        t.request["key"] == c.request["key"]
        for t, c in zip(
            sorted(replayed.turns, key=lambda t: (t.session, t.turn)),
            sorted(captured, key=lambda t: (t.session, t.turn)),
        )
    )
    assert sum(bool(t.request.get("compared")) for t in replayed.turns) > len(captured) // 2

    # At a quarter of the recorded pace the replay cannot take less than a quarter of the capture's span.
    def span(turns):
        return (max(t.timings.start_wall_ns for t in turns) - min(t.timings.start_wall_ns for t in turns)) / 1e9

    assert span(replayed.turns) >= span(captured) / 4 - 0.05
    summary = json.loads((run_dir / "summary.json").read_text())
    assert replayed.run["replay"]["unplayable"] == 0 and "report:" in r.stdout
    assert summary["counts"]["reference_mismatch"] == 0
    assert summary["reference"]["compared"] > 0 and summary["reference"]["mismatched"] == 0

    # A capture whose turn lost its body: that turn is said and counted, the others still replayed.
    partial = tmp_path / "partial"
    shutil.copytree(capture, partial)
    lines = [json.loads(line) for line in (partial / "turns.jsonl").read_text().splitlines()]
    lost = lines[1]
    del lost["request"]["body"]
    (partial / "turns.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    r = run_cli(
        "agents",
        "--replay",
        str(partial),
        "--url",
        fast_replay.url,
        "--speed",
        "max",
        "--out",
        str(tmp_path / "replayed-partial"),
        "--quiet",
        timeout=120,
    )
    assert r.returncode == 0 and f"1 of {len(lines)} captured turns keep no request body" in r.stderr, r.stderr
    history = read_history(only_run_dir(tmp_path / "replayed-partial"))
    assert (lost["session"], lost["turn"]) not in {(t.session, t.turn) for t in history.turns}
    assert len(history.turns) == len(lines) - 1 and history.run["replay"]["unplayable"] == 1
    assert [(e["session"], e["turn"]) for e in history.events if e["kind"] == "replay_unplayable"] == [
        (lost["session"], lost["turn"])
    ]


def test_a_capture_replayed_against_the_bundled_engine_reproduces_its_answers(tmp_path):
    engine = start_engine([], log_dir=tmp_path)
    try:
        capture = capture_agents(
            engine.url, tmp_path, "--sessions", "2", "--concurrency", "2", "--max-turns", "3", "--max-tokens", "96"
        )
    finally:
        engine.stop()
    captured = read_history(capture).turns
    # No --url: the bundled engine is started for the replay, as for any `agents` run.
    r = run_cli(
        "agents",
        "--replay",
        str(capture),
        "--speed",
        "max",
        "--reference",
        str(capture),
        "--out",
        str(tmp_path / "replayed"),
        "--quiet",
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    replayed = read_history(only_run_dir(tmp_path / "replayed")).turns
    view = {(t.session, t.turn): (turn_view(t), t.response.content if t.response else None) for t in replayed}
    assert view == {(t.session, t.turn): (turn_view(t), t.response.content if t.response else None) for t in captured}
    assert len(replayed) == len(captured) > 3 and all(
        t.request.get("compared") for t in replayed if t.status.value == "ok"
    )
    assert not any(v.code == "reference_mismatch" for t in replayed for v in t.verdicts)
