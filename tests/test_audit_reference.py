"""`audit RUN --reference REF`: a recorded run judged offline against another, as `agents
--reference` judges live; and `audit` of a run folder `dsv4bench proxy` captured, whose passing
turns kept no request body or stream and are counted as such."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from dsv4bench.modes.audit import audit_file
from dsv4bench.history.run_folder import read_history
from dsv4bench.harness.reference_run import ReferenceAnswers
from tests.cli_output import assert_one_line_exit_2, invoke
from tests.e2e.conftest import only_run_dir, run_cli, start_replay
from tests.e2e.test_proxy import start_proxy_cli

RUN = (
    "--sessions",
    "8",
    "--concurrency",
    "4",
    "--max-turns",
    "8",
    "--seed",
    "11",
    "--temperature",
    "0",
    "--ttft-timeout",
    "3",
    "--total-timeout",
    "8",
    "--quiet",
)


def turn(session: str, n: int, key: str, content: str, temperature: float = 0, status: str = "ok") -> dict:
    return {
        "run": "r",
        "session": session,
        "turn": n,
        "scenario": "coding",
        "seed": 1,
        "status": status,
        "request": {"key": key, "temperature": temperature, "stream": True},
        "response": {"content": content, "finish_reason": "stop"},
        "verdicts": [],
        "raw_sse": None,
    }


def run_folder(path: Path, records: list[dict]) -> Path:
    path.mkdir()
    (path / "turns.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def found(results) -> list[tuple[str, int]]:
    return [(r.session, r.turn) for r in results if any(v.code == "reference_mismatch" for v in r.verdicts)]


def test_each_session_is_judged_up_to_its_first_parting_only(tmp_path):
    ref = run_folder(
        tmp_path / "ref",
        [
            turn("a", 0, "a0", "x"),
            turn("a", 1, "a1", "x"),
            turn("a", 2, "a2", "x"),
            turn("b", 0, "b0", "x"),
            turn("b", 1, "b1", "x"),
        ],
    )
    # Out of turn order, as concurrent sessions write them; a's turns 1 and 2 both differ, b's agree.
    run = run_folder(
        tmp_path / "run",
        [
            turn("a", 2, "a2", "z"),
            turn("b", 0, "b0", "x"),
            turn("a", 0, "a0", "x"),
            turn("a", 1, "a1", "y"),
            turn("b", 1, "b1", "x"),
            turn("c", 0, "c0", "x"),
            turn("b", 2, "b1", "x", status="error"),
        ],
    )
    results = audit_file(run, ReferenceAnswers.load(ref))
    assert found(results) == [("a", 1)]  # a's turn 2 came after a had parted: not compared
    assert [(r.session, r.turn) for r in results if r.reference_parted] == [("a", 2)]
    assert sum(r.reference_compared for r in results) == 4  # a0, a1, b0, b1; c0 has no reference, b2 failed
    [v] = results[3].verdicts
    assert v.where == "content" and "reference a turn 1" in v.detail and results[3].corrupt

    r = invoke("audit", str(run), "--reference", str(ref), "--fail-on", "corruption")
    assert r.exit_code == 1, r.stderr
    assert "4 completed greedy turns sent a request the reference had answered; 1 got a different answer" in r.stdout
    assert "1 later turns of parted sessions not compared" in r.stdout
    assert "session a first parts at turn 1 (content)" in r.stdout
    assert invoke("audit", str(ref), "--reference", str(ref), "--fail-on", "corruption").exit_code == 0


def test_a_bad_reference_or_a_run_at_temperature_is_one_line_exit_2(tmp_path):
    ref = run_folder(tmp_path / "ref", [turn("a", 0, "a0", "x")])
    hot = run_folder(tmp_path / "hot", [turn("a", 0, "a0", "x", temperature=0.7)])
    assert_one_line_exit_2(invoke("audit", str(ref), "--reference", str(tmp_path / "nowhere")), "no such folder")
    assert_one_line_exit_2(
        invoke("audit", str(ref), "--reference", str(ref / "turns.jsonl")), "a file, not a run folder"
    )
    assert_one_line_exit_2(invoke("audit", str(ref), "--reference", str(tmp_path)), "holds 2 runs")
    (tmp_path / "empty").mkdir()
    assert_one_line_exit_2(invoke("audit", str(ref), "--reference", str(tmp_path / "empty")), "not a dsv4bench run")
    assert_one_line_exit_2(invoke("audit", str(ref), "--reference", str(hot)), "no completed greedy turn")
    assert_one_line_exit_2(invoke("audit", str(hot), "--reference", str(ref)), "no greedy turn to compare")
    assert_one_line_exit_2(invoke("audit", str(tmp_path / "empty")), "is a folder with no turns.jsonl")
    odd = run_folder(
        tmp_path / "odd",
        [{**turn("a", 0, "a0", "x"), "request": "body"}, {**turn("a", 1, "a1", "y"), "response": {"tool_calls": 5}}],
    )
    assert_one_line_exit_2(invoke("audit", str(ref), "--reference", str(odd)), "no completed greedy turn")


@pytest.fixture(scope="module")
def clean_reference(tmp_path_factory):
    """A run of the clean replay server: what every answer should be."""
    tmp = tmp_path_factory.mktemp("reference")
    srv = start_replay(tmp, fault_rate=0)
    try:
        r = run_cli("agents", "--url", srv.url, *RUN, "--out", str(tmp / "runs"))
        assert r.returncode == 0, r.stderr
    finally:
        srv.stop()
    return only_run_dir(tmp / "runs")


def test_offline_judging_gives_the_verdicts_the_live_reference_gave(clean_reference, tmp_path):
    # The known-bad replay server plants faults on some turns: those answers differ from the
    # clean reference's, and their sessions part ways from it there.
    srv = start_replay(tmp_path, fault_rate=25, stall=1.0)
    try:
        r = run_cli(
            "agents", "--url", srv.url, *RUN, "--out", str(tmp_path / "runs"), "--reference", str(clean_reference)
        )
        assert "Traceback" not in r.stderr, r.stderr
    finally:
        srv.stop()
    run_dir = only_run_dir(tmp_path / "runs")
    live = read_history(run_dir)
    live_found = [(t.session, t.turn) for t in live.turns if any(v.code == "reference_mismatch" for v in t.verdicts)]
    assert live_found, "no answer differed from the reference: nothing was judged"
    assert any(t.session == s and t.turn > n for s, n in live_found for t in live.turns), (
        "no session went on past its parting: the rule was not exercised"
    )
    live_compared = json.loads((run_dir / "summary.json").read_text())["reference"]["compared"]

    results = audit_file(run_dir, ReferenceAnswers.load(clean_reference))
    assert found(results) == live_found
    assert sum(r.reference_compared for r in results) == live_compared > len(live_found)
    assert not any(r.reference_parted for r in results)  # parted sessions sent requests the reference never saw

    out = tmp_path / "audit.jsonl"
    a = run_cli(
        "audit", str(run_dir), "--reference", str(clean_reference), "--out", str(out), "--fail-on", "corruption"
    )
    assert a.returncode == 1, a.stderr
    assert f"{live_compared} completed greedy turns sent a request" in a.stdout
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert sum(x["reference_compared"] for x in lines) == live_compared
    assert [
        (x["session"], x["turn"]) for x in lines if any(v["code"] == "reference_mismatch" for v in x["verdicts"])
    ] == live_found


def test_a_mismatch_planted_in_the_reference_is_found_at_that_turn(clean_reference, tmp_path):
    records = [json.loads(x) for x in (clean_reference / "turns.jsonl").read_text().splitlines()]
    target = next(r for r in records if r["turn"] == 1 and r["status"] == "ok" and r["response"]["tool_calls"])
    target["response"]["tool_calls"][0]["arguments"] += " "
    changed = run_folder(tmp_path / "changed", records)

    a = run_cli("audit", str(clean_reference), "--reference", str(changed), "--fail-on", "corruption")
    assert a.returncode == 1 and "1 got a different answer" in a.stdout, a.stdout + a.stderr
    assert f"session {target['session']} first parts at turn 1 (tool_calls[0].arguments)" in a.stdout
    results = audit_file(clean_reference, ReferenceAnswers.load(changed))
    assert found(results) == [(target["session"], 1)]
    later = [(r.session, r.turn) for r in results if r.reference_parted]
    assert later == [
        (x["session"], x["turn"])
        for x in records
        if x["session"] == target["session"] and x["turn"] > 1 and x["status"] == "ok"
    ]
    assert (
        run_cli(
            "audit", str(clean_reference), "--reference", str(clean_reference), "--fail-on", "corruption"
        ).returncode
        == 0
    )


def test_a_proxy_capture_is_re_judged_and_its_unkept_turns_counted(tmp_path):
    srv = start_replay(tmp_path, fault_rate=25, stall=1.0)
    try:
        proxy = start_proxy_cli(srv.url, tmp_path / "proxy", "--quiet")
        try:
            r = run_cli("agents", "--url", proxy.url, *RUN, "--out", str(tmp_path / "agents"))
            assert "Traceback" not in r.stderr, r.stderr
            httpx.get(f"{proxy.url}/models", timeout=5)
        finally:
            rc, _, stderr = proxy.interrupt()
        assert rc in (0, 1), stderr
    finally:
        srv.stop()
    run_dir = only_run_dir(tmp_path / "proxy")
    recorded = read_history(run_dir).turns
    assert any(t.verdicts for t in recorded) and any(not t.verdicts for t in recorded)

    results = audit_file(run_dir)
    assert len(results) == len(recorded)
    for t, r in zip(recorded, results):
        assert (r.session, r.turn) == (t.session, t.turn)
        # A failing turn kept its request and stream: re-read from them, it gets the same verdicts.
        assert sorted({v.code for v in r.verdicts}) == sorted({v.code for v in t.verdicts}), (t.session, t.turn)
        assert r.summary_only == (not t.verdicts and t.raw_sse is None)
    unkept = sum(r.summary_only for r in results)
    assert 0 < unkept < len(results)

    out = tmp_path / "audit.jsonl"
    a = run_cli("audit", str(run_dir), "--out", str(out))
    assert a.returncode == 0, a.stderr
    assert f"{unkept} turns could not be re-judged: the record kept no request body or stream" in a.stdout
    assert sum(json.loads(x)["summary_only"] for x in out.read_text().splitlines()) == unkept
