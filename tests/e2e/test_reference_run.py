"""`agents --reference`: the real CLI against the real engine on loopback, twice with one seed,
then against a reference whose recorded answer for one turn was changed (a reference that
disagrees, standing in for a server with wrong state)."""

from __future__ import annotations

import json

import pytest

from dsv4bench.engine.launcher import start_engine
from dsv4bench.history.run_folder import read_history

from .conftest import only_run_dir, run_cli

RUN = ("--sessions", "4", "--concurrency", "4", "--max-turns", "3", "--seed", "11", "--quiet")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    ep = start_engine(["--num-pages", "4096"], log_dir=tmp_path_factory.mktemp("engine"))
    yield ep
    ep.stop()


@pytest.fixture(scope="module")
def reference(engine, tmp_path_factory):
    out = tmp_path_factory.mktemp("reference")
    r = run_cli("agents", "--url", engine.url, *RUN, "--out", str(out))
    assert r.returncode == 0, r.stderr
    return only_run_dir(out)


def _summary(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


def test_the_same_seed_again_repeats_every_answer(engine, reference, tmp_path):
    # The second run's prefixes come from the radix cache the first one filled: cached and
    # computed prefixes must give the same greedy answers.
    r = run_cli("agents", "--url", engine.url, *RUN, "--out", str(tmp_path), "--reference", str(reference))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    s = _summary(only_run_dir(tmp_path))
    assert s["verdict"] == "CLEAN"
    assert s["reference"]["compared"] == s["turns"]["ok"] == _summary(reference)["turns"]["ok"] > 0
    assert s["reference"]["mismatched"] == 0 and s["reference"]["conflicts"] == 0


def test_a_reference_that_answered_differently_is_found_at_that_turn(engine, reference, tmp_path):
    changed = tmp_path / "changed"
    changed.mkdir()
    lines = (reference / "turns.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    target = next(r for r in records if r["turn"] == 2 and r["status"] == "ok" and r["response"]["tool_calls"])
    target["response"]["tool_calls"][0]["arguments"] += " "
    (changed / "turns.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))

    out = tmp_path / "runs"
    r = run_cli(
        "agents", "--url", engine.url, *RUN, "--out", str(out), "--reference", str(changed), "--fail-on", "corruption"
    )
    assert r.returncode == 1 and "CORRUPTION" in r.stdout, r.stderr
    run_dir = only_run_dir(out)
    h = read_history(run_dir)
    flagged = [(t.session, t.turn) for t in h.turns if any(v.code == "reference_mismatch" for v in t.verdicts)]
    assert flagged == [(target["session"], 2)]
    [v] = [v for t in h.turns for v in t.verdicts]
    assert v.where == "tool_calls[0].arguments" and f"reference {target['session']} turn 2" in v.detail
    # The answer was well formed: the session went on to its next turn as in the reference.
    assert any(t.session == target["session"] and t.turn == 3 for t in h.turns) == any(
        x["session"] == target["session"] and x["turn"] == 3 for x in records
    )
    s = _summary(run_dir)
    assert s["counts"]["reference_mismatch"] == 1 and s["reference"]["mismatched"] == 1
    assert "**Reference run**" in (run_dir / "report.md").read_text()


def test_a_reference_from_other_tasks_compares_nothing_and_says_so(engine, reference, tmp_path):
    r = run_cli(
        "agents",
        "--url",
        engine.url,
        "--sessions",
        "1",
        "--max-turns",
        "1",
        "--seed",
        "99",
        "--quiet",
        "--out",
        str(tmp_path),
        "--reference",
        str(reference),
    )
    assert r.returncode == 0, r.stderr
    run_dir = only_run_dir(tmp_path)
    assert _summary(run_dir)["reference"]["compared"] == 0
    assert "No request matched the reference run's" in (run_dir / "report.md").read_text()
