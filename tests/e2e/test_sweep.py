"""End to end: `dsv4bench sweep` against the replay server with its corruption planted only
above a concurrency threshold finds that threshold, and `--fail-on` judges the sweep as a whole."""

from __future__ import annotations

import json

import pytest

from .conftest import run_cli, start_fixture_server

CORRUPT_ABOVE = 4  # the server plants faults only on requests arriving with more than 4 in flight


@pytest.fixture
def loaded_replay(tmp_path):
    """The replay server with a load bug: half of the turns get a fault, but only under load.
    Its latency keeps every session's request at the server long enough for them to overlap."""
    ledger = tmp_path / "ledger.jsonl"
    ledger.touch()
    srv = start_fixture_server(
        "replay_server.py",
        tmp_path,
        "/v1/models",
        "--fault-rate",
        "50",
        "--corrupt-above",
        str(CORRUPT_ABOVE),
        "--latency",
        "0.02",
        "--stall",
        "0.2",
        "--ledger",
        str(ledger),
    )
    yield f"{srv.root}/v1", ledger
    srv.stop()


def _sweep(url: str, out, levels: str, *extra: str):
    return run_cli(
        "sweep",
        "--url",
        url,
        "--concurrency",
        levels,
        "--sessions",
        "16",
        "--max-turns",
        "4",
        "--precision",
        "0.2",
        "--level-turns",
        "200",
        "--ttft-timeout",
        "5",
        "--out",
        str(out),
        *extra,
        timeout=120,
    )


def test_sweep_finds_the_concurrency_above_which_corruption_is_planted(loaded_replay, tmp_path):
    url, ledger = loaded_replay
    out = tmp_path / "sweeps"
    r = _sweep(url, out, "1,2-4,8,16", "--fail-on", "corruption")
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 1, r.stdout + r.stderr  # corruption found at some level: the sweep fails
    assert "corruption appears at concurrency 8" in r.stdout
    assert "level c1 ..." in r.stderr and "c8 batch 0:" in r.stderr  # progress per level and batch

    (sweep_dir,) = out.iterdir()
    summary = json.loads((sweep_dir / "sweep.json").read_text())
    assert summary["threshold"] == 8
    by_level = {lv["concurrency"]: lv for lv in summary["levels"]}
    assert list(by_level) == [1, 2, 3, 4, 8, 16]
    for level in (1, 2, 3, 4):  # at most CORRUPT_ABOVE requests in flight: never a fault
        assert by_level[level]["verdict"] == "CLEAN" and by_level[level]["turns"]["corrupt"] == 0
        assert by_level[level]["turns"]["ok"] >= 16, by_level[level]
    for level in (8, 16):
        lower, upper = by_level[level]["interval"]
        assert by_level[level]["verdict"] == "CORRUPTION" and lower > 0
        assert by_level[level]["stopped_by"] in ("precision", "turn budget")
        assert upper - lower <= 0.2 or by_level[level]["turns"]["total"] >= 200
    # The server's own ledger agrees: every fault was planted on a request that arrived above the threshold.
    planted = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert planted and all(p["in_flight"] > CORRUPT_ABOVE for p in planted)

    # Every batch is an ordinary run folder with its report, at its level and its seed.
    for lv in summary["levels"]:
        assert len(lv["runs"]) == lv["batches"] >= 1
        for batch, run in enumerate(lv["runs"]):
            run_dir = sweep_dir / run
            assert run_dir.parent.name == f"c{lv['concurrency']}"
            assert (run_dir / "report.md").exists()
            run_info = json.loads((run_dir / "run.json").read_text())
            assert run_info["config"]["concurrency"] == lv["concurrency"] and run_info["config"]["seed"] == batch
            assert run_info["command"].startswith("dsv4bench agents --url")
            assert f"--concurrency {lv['concurrency']} --seed {batch}" in run_info["command"]
            assert "--precision" not in run_info["command"]
    md = (sweep_dir / "sweep.md").read_text()
    assert "**Corruption appears at concurrency 8**" in md and "## By turn depth" in md
    assert (sweep_dir / "sweep.png").read_bytes()[:4] == b"\x89PNG"


def test_sweep_below_the_threshold_passes_fail_on(loaded_replay, tmp_path):
    url, _ = loaded_replay
    r = _sweep(url, tmp_path / "sweeps", "1-4:2", "--fail-on", "corruption", "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no level shows corruption" in r.stdout and "level c1" not in r.stderr
    (sweep_dir,) = (tmp_path / "sweeps").iterdir()
    summary = json.loads((sweep_dir / "sweep.json").read_text())
    assert summary["threshold"] is None and [lv["concurrency"] for lv in summary["levels"]] == [1, 2, 4]


@pytest.mark.parametrize(
    "args, says",
    [
        (("--concurrency", "8-1"), "the range ends below its start"),
        (("--concurrency", "1,8", "--precision", "0"), "--precision"),
        (("--concurrency", "1,8", "--fail-on", "slowness"), "--fail-on takes"),
        (("--concurrency", "1,8", "--url", "ftp://x"), "--url must be an http(s) URL"),
    ],
)
def test_bad_flags_are_one_line_and_start_nothing(tmp_path, args, says):
    out = tmp_path / "sweeps"
    r = run_cli("sweep", "--out", str(out), *args, timeout=60)
    assert r.returncode == 2 and says in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not r.stdout
    assert not out.exists() or not any(out.iterdir())
