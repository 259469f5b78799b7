"""Locust's master and workers on loopback, against the known-bad replay server: the master's one
run folder is the merge of what every worker recorded, sessions numbered apart per worker, and
a worker killed mid-run loses only its turns in flight, which the merged history marks."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest

from dsv4bench.history.run_folder import read_history
from dsv4bench.report.counting import turn_codes

from .conftest import ROOT, free_port, only_run_dir, start_replay

# NOTE: not importorskip: importing Locust would patch this whole pytest process for gevent.
if importlib.util.find_spec("locust") is None:
    pytest.skip("Locust is not installed (pip install 'dsv4bench[locust]')", allow_module_level=True)


def locust_cli(*args: str, log: Path) -> subprocess.Popen:
    with open(log, "w") as out:  # the child keeps its own copy of the file
        return subprocess.Popen(
            [sys.executable, "-m", "dsv4bench", "locust", *args],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(os.environ),
        )


def start_cluster(tmp_path: Path, url: str, workers: int, run_time: str, users: int = 6) -> tuple:
    port = free_port()
    master = locust_cli(
        "--host",
        url,
        "--max-turns",
        "4",
        "--out",
        str(tmp_path / "runs"),
        "--master",
        "--master-bind-port",
        str(port),
        "--expect-workers",
        str(workers),
        "--headless",
        "-u",
        str(users),
        "-r",
        str(users),
        "-t",
        run_time,
        log=tmp_path / "master.log",
    )
    started = [
        locust_cli(
            "--worker", "--master-host", "127.0.0.1", "--master-port", str(port), log=tmp_path / f"worker{i}.log"
        )
        for i in range(workers)
    ]
    return master, started


def finish(proc: subprocess.Popen, timeout: float = 90) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


def test_a_master_and_two_workers_write_one_history_that_sums_what_each_recorded(tmp_path):
    replay = start_replay(tmp_path, fault_rate=20)
    try:
        master, workers = start_cluster(tmp_path, replay.url, workers=2, run_time="8s")
        code = finish(master)
        for w in workers:
            finish(w, 30)
    finally:
        replay.stop()
    assert code == 0, (tmp_path / "master.log").read_text()[-3000:]
    run_dir = only_run_dir(tmp_path / "runs")
    history = read_history(run_dir)
    told = [e for e in history.events if e["kind"] == "worker_recorded"]
    assert len(told) == 2 and {e["worker_index"] for e in told} == {0, 1}
    assert sum(e["turns"] for e in told) == len(history.turns) > 0
    counted: Counter[str] = Counter()
    for t in history.turns:
        counted.update(turn_codes(t))
    summed: Counter[str] = Counter()
    for e in told:
        summed.update(e["codes"])
    assert counted == summed and counted  # the replay server plants codes: some must show
    starts = [e for e in history.events if e["kind"] == "session_start"]
    assert len({e["seed"] for e in starts}) == len(starts)  # no two sessions play the same seed
    assert len({e["worker"] for e in starts}) == 2  # both workers played
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["turns"]["total"] == len(history.turns) and summary["history"]["complete"]


def test_a_worker_that_dies_loses_only_its_turns_in_flight_and_the_history_says_so(tmp_path):
    replay = start_replay(tmp_path, fault_rate=0)
    try:
        master, (doomed, survivor) = start_cluster(tmp_path, replay.url, workers=2, run_time="11s")
        deadline = time.monotonic() + 60
        log = tmp_path / "master.log"
        while "recording into" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(3)  # both workers mid-session
        # The worker's Locust process itself dies at once (its dsv4bench parent would stop it gently).
        for child in psutil.Process(doomed.pid).children(recursive=True):
            child.send_signal(signal.SIGKILL)
        code = finish(master)
        finish(survivor, 30)
        doomed.wait(5)
    finally:
        replay.stop()
    assert code == 0, (tmp_path / "master.log").read_text()[-3000:]
    run_dir = only_run_dir(tmp_path / "runs")
    history = read_history(run_dir)
    lost = [e for e in history.events if e["kind"] == "worker_lost"]
    assert len(lost) == 1
    ends = {e["session"]: e for e in history.events if e["kind"] == "session_end"}
    gone = [e for e in ends.values() if e["reason"] == "worker_lost"]
    assert gone and all(e["worker"] == lost[0]["worker"] for e in gone)
    marked = {e["session"] for e in history.events if e["kind"] == "turn_lost"}
    assert marked == {e["session"] for e in gone}
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["history"]["complete"], summary["history"]  # nothing lost but what was in flight
    assert len(told := [e for e in history.events if e["kind"] == "worker_recorded"]) == 1
    assert told[0]["turns"] < len(history.turns)  # the dead worker's turns before it died are kept
