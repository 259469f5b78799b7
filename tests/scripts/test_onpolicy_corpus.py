"""The on-policy corpus script: it plays sessions through a real engine on loopback, keeps each
finished one at once, plays nothing twice, and builds a corpus from relabelled rollouts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dsv4bench.engine.training.onpolicy import Rollout
from tests.engine.test_train_onpolicy import SEED, looping_rollout

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "scripts" / "onpolicy_corpus.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_plays_through_the_engine_keeps_each_session_and_never_plays_one_twice(tmp_path):
    from dsv4bench.engine.launcher import start_engine

    engine = start_engine(["--num-pages", "4096"], log_dir=tmp_path)
    try:
        rollouts = tmp_path / "rollouts.jsonl"
        args = (
            "--rollouts",
            str(rollouts),
            "--url",
            engine.url,
            "--family",
            "ops",
            "--sessions",
            "2",
            "--max-turns",
            "3",
            "--concurrency",
            "2",
        )
        cut = run(*args, "--minutes", "0.005")  # 0.3 s: over before a session's first turns are done
        assert cut.returncode == 0, cut.stderr
        assert "time is up: 0 of 2 sessions played" in cut.stdout and not rollouts.exists()
        first = run(*args)
        assert first.returncode == 0, first.stderr
        assert "playing 2 sessions" in first.stdout
        lines = [json.loads(x) for x in rollouts.read_text().splitlines()]
        assert sorted((x["family"], x["seed"], x["temperature"]) for x in lines) == [
            ("ops", 500_000, 0.0),
            ("ops", 500_001, 0.0),
        ]
        for x in lines:
            roles = [m["role"] for m in x["messages"]]
            assert roles[:2] == ["system", "user"] and 1 <= roles.count("assistant") <= 3
        again = run(*args)
        assert again.returncode == 0 and "playing" not in again.stdout
        assert len(rollouts.read_text().splitlines()) == 2
    finally:
        engine.stop()


def test_builds_a_corpus_of_relabelled_rollouts_and_a_mix(tmp_path):
    from dsv4bench.engine.training.corpus import build_corpus

    rollouts = tmp_path / "rollouts.jsonl"
    line = json.dumps(Rollout("ops", SEED, 0.0, looping_rollout()).to_json())
    rollouts.write_text(line + "\n" + line[: len(line) // 2])  # the second line was cut by a crash
    base = tmp_path / "base.npz"
    build_corpus(["coding"], [100_000, 100_001, 100_002], base)
    out = tmp_path / "onpolicy.npz"
    r = run("--rollouts", str(rollouts), "--out", str(out), "--mix", str(base), "--mix-sessions", "2")
    assert r.returncode == 0, r.stderr
    assert "1 rollouts: relabelled 1" in r.stdout
    with np.load(out) as z:
        meta = json.loads(str(z["meta"]))
    relabelled = [m for m in meta if m == ["ops", SEED]]
    assert relabelled and len(meta) == len(relabelled) + 2
    assert sum(m[0] == "coding" for m in meta) == 2


@pytest.mark.parametrize(
    "args, message",
    [
        (("--sessions", "-1"), "--sessions must be >= 0"),
        (("--mix", "/nonexistent.npz"), "no such file"),
        (("--out", "x.npz"), "no rollouts in"),
    ],
)
def test_bad_arguments_get_one_line(tmp_path, args, message):
    r = run("--rollouts", str(tmp_path / "none.jsonl"), *args)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


def test_stats_scores_the_rollouts_per_temperature_and_family(tmp_path):
    from dsv4bench.agents import play_expert, session_messages

    rollouts = tmp_path / "rollouts.jsonl"
    rows = [
        Rollout("ops", SEED, 0.0, looping_rollout()),
        Rollout("ops", SEED, 0.0, session_messages(play_expert("ops", SEED))),
        Rollout("data", 100_000, 0.7, session_messages(play_expert("data", 100_000))),
    ]
    rollouts.write_text("".join(json.dumps(r.to_json()) + "\n" for r in rows))
    res = run("--rollouts", str(rollouts), "--stats")
    assert res.returncode == 0, res.stderr
    table = {tuple(line.split()[:2]): line.split() for line in res.stdout.splitlines()[1:]}
    assert set(table) == {("0", "ops"), ("0", "all"), ("0.7", "data"), ("0.7", "all")}
    ops = table[("0", "ops")]
    # sessions, turns, then "ok/calls", "=", share, sessions with a refused call, final, solved
    assert ops[2] == "2" and ops[-3:] == ["1", "1", "1"]
    ok, calls = map(int, ops[4].split("/"))
    assert calls - ok == 16 - 8  # the looping rollout's refused turns; the expert's are all valid
    assert table[("0.7", "data")][-3:] == ["0", "1", "1"]
    empty = tmp_path / "none.jsonl"
    empty.write_text("")
    bad = run("--rollouts", str(empty), "--stats")
    assert bad.returncode == 2 and "no rollouts" in bad.stderr and "Traceback" not in bad.stderr
