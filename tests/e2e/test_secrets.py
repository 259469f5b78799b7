"""No file a run writes holds the API key: every command that takes one, the key given as a
flag or through its environment variable, with a recovery command that carries and prints it,
and against a server that echoes the key back in its answers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from dsv4bench.engine.launcher import start_engine

from .conftest import ROOT, only_run_dir, run_cli

KEY = "sk-test-8c1f0e5d2b7a"


def files_holding_the_key(folder: Path) -> list[str]:
    return [
        str(p.relative_to(folder)) for p in sorted(folder.rglob("*")) if p.is_file() and KEY.encode() in p.read_bytes()
    ]


@pytest.fixture(scope="module")
def keyed_engine(tmp_path_factory):
    ep = start_engine(["--num-pages", "2048", "--api-key", KEY], log_dir=tmp_path_factory.mktemp("engine"))
    yield ep
    ep.stop()


def test_agents_against_a_keyed_engine_writes_no_key(keyed_engine, tmp_path):
    r = run_cli(
        "agents",
        "--url",
        keyed_engine.url,
        "--api-key",
        KEY,
        "--sessions",
        "2",
        "--concurrency",
        "2",
        "--max-turns",
        "2",
        "--metrics",
        keyed_engine.metrics_url,
        "--drain-timeout",
        "1",
        "--quiet",
        "--kill",
        "all@4s,abort",
        "--out",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stderr
    run_dir = only_run_dir(tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["turns"]["total"] > 0  # the key worked: turns were served
    assert files_holding_the_key(tmp_path) == []
    # The reproduce line names the variable instead, and still runs as a command line.
    run = json.loads((run_dir / "run.json").read_text())
    assert '--api-key "$DSV4BENCH_API_KEY"' in run["command"]
    assert '--api-key "$DSV4BENCH_API_KEY"' in (run_dir / "report.md").read_text()


def test_key_from_the_environment_writes_no_key(keyed_engine, tmp_path):
    env = {**os.environ, "DSV4BENCH_API_KEY": KEY}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "dsv4bench",
            "agents",
            "--url",
            keyed_engine.url,
            "--sessions",
            "1",
            "--max-turns",
            "1",
            "--quiet",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert files_holding_the_key(tmp_path) == []


def test_probe_json_of_a_keyed_engine_writes_no_key(keyed_engine, tmp_path):
    out = tmp_path / "probe.json"
    r = run_cli("probe", keyed_engine.url.removesuffix("/v1"), "--api-key", KEY, "--json", str(out), "--timeout", "10")
    assert r.returncode == 0, r.stdout + r.stderr
    assert out.exists() and files_holding_the_key(tmp_path) == []


def test_recovery_command_and_its_output_lose_the_key(wedge_server, tmp_path):
    httpx.post(f"{wedge_server}/control", json={"stuck": {"sglang:num_prefill_inflight_queue_reqs": 1}}, timeout=5)
    fix = (
        f"API_TOKEN={KEY} {sys.executable} -c \"import httpx; print('using {KEY}'); "
        f"httpx.post('{wedge_server}/control', json={{'reset': True}})\" --password {KEY}"
    )
    r = run_cli(
        "agents",
        "--url",
        f"{wedge_server}/v1",
        "--metrics",
        f"{wedge_server}/metrics",
        "--metrics-interval",
        "0.2",
        "--sessions",
        "1",
        "--max-turns",
        "1",
        "--no-stream",
        "--quiet",
        "--api-key",
        KEY,
        "--drain-timeout",
        "6",
        "--recover-cmd",
        fix,
        "--out",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    run = json.loads((only_run_dir(tmp_path) / "run.json").read_text())
    assert run["recovery"]["exit_code"] == 0  # the command ran as given, key and all
    assert "using ***" in run["recovery"]["output_tail"]
    assert files_holding_the_key(tmp_path) == []


def test_a_server_that_echoes_the_key_back_leaves_no_key_in_the_run(tmp_path):
    from .conftest import start_fixture_server

    srv = start_fixture_server("hostile_server.py", tmp_path, "/health", "--modes", "echo_auth,normal")
    try:
        out = tmp_path / "runs"
        r = run_cli(
            "agents",
            "--url",
            f"{srv.root}/v1",
            "--api-key",
            KEY,
            "--sessions",
            "2",
            "--concurrency",
            "2",
            "--max-turns",
            "1",
            "--quiet",
            "--out",
            str(out),
        )
        assert r.returncode == 0, r.stderr
        run_dir = only_run_dir(out)
        turns = [json.loads(line) for line in (run_dir / "turns.jsonl").read_text().splitlines()]
        echoed = [t for t in turns if t.get("http_status") == 403]
        assert echoed and "key not accepted: 'Bearer ***'" in json.dumps(echoed[0])  # recorded, key masked
        assert files_holding_the_key(out) == []
    finally:
        srv.stop()


# Keys that are JSON tokens, JSON syntax or words of every record: masking them inside serialized
# lines once rewrote every later record into something unparseable.
AWKWARD_KEYS = ["true", "null", "turn", "ok", '"', "\\", "{"]


def assert_every_record_reads_back(run_dir: Path) -> list[dict]:
    """Every line of the run's JSONL files and its JSON files parses; returns the turn records."""
    for name in ("run.json", "summary.json"):
        assert isinstance(json.loads((run_dir / name).read_text()), dict), name
    for name in ("events.jsonl", "metrics.jsonl"):
        for line in (run_dir / name).read_text().splitlines():
            json.loads(line)
    return [json.loads(line) for line in (run_dir / "turns.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("key", AWKWARD_KEYS)
def test_an_awkward_key_leaves_every_record_whole_and_every_turn_reported(key, clean_replay, tmp_path):
    r = run_cli(
        "agents",
        "--url",
        clean_replay.url,
        "--api-key",
        key,
        "--sessions",
        "2",
        "--concurrency",
        "2",
        "--max-turns",
        "3",
        "--quiet",
        "--out",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stderr
    run_dir = only_run_dir(tmp_path)
    turns = assert_every_record_reads_back(run_dir)
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    ended = sum(e["turns"] for e in events if e["kind"] == "session_end")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert ended >= 2 and len(turns) == ended == summary["turns"]["total"]
    run = json.loads((run_dir / "run.json").read_text())
    assert run["config"]["api_key"] == "***" and '--api-key "$DSV4BENCH_API_KEY"' in run["command"]


def test_a_proxy_client_sending_bearer_true_corrupts_no_record(clean_replay, tmp_path):
    from .test_proxy import raw_stream_bytes, start_proxy_cli, tagged

    proxy = start_proxy_cli(clean_replay.url, tmp_path / "proxy", "--quiet")
    try:
        for i in range(8):
            raw_stream_bytes(
                proxy.url,
                {**tagged(f"t-{i}"), "Authorization": "Bearer true"},
                model="replay-dsv4",
                messages=[{"role": "user", "content": "is it true? null or ok"}],
            )
    finally:
        rc, _, stderr = proxy.interrupt()
    assert rc == 0, stderr
    run_dir = only_run_dir(tmp_path / "proxy")
    turns = assert_every_record_reads_back(run_dir)
    assert len(turns) == 8 and json.loads((run_dir / "summary.json").read_text())["turns"]["total"] == 8
    # The answers that held the words `true`, `null` and `ok` are recorded as they came.
    assert all("is it true? null or ok" in json.dumps(t) for t in turns)


def test_run_folder_and_every_file_in_it_are_private(clean_replay, tmp_path):
    r = run_cli(
        "agents", "--url", clean_replay.url, "--sessions", "2", "--max-turns", "2", "--quiet", "--out", str(tmp_path)
    )
    assert r.returncode == 0, r.stderr
    run_dir = only_run_dir(tmp_path)
    paths = [run_dir, *run_dir.rglob("*")]
    assert any(p.suffix == ".png" for p in paths) and (run_dir / "report.md").exists()
    wrong = {
        str(p.relative_to(tmp_path)): oct(p.stat().st_mode & 0o777)
        for p in paths
        if p.stat().st_mode & 0o777 != (0o700 if p.is_dir() else 0o600)
    }
    assert wrong == {}
