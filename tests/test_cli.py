"""CLI manners: one-line errors for bad flags and unreachable servers, never a traceback."""

import subprocess
import sys

import pytest

from dsv4bench.engine.launcher import free_port


def run_cli(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "dsv4bench", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(
    "args,needle",
    [
        (["agents", "--sessions", "1", "--metrics", "ftp://x"], "--metrics must be an http(s) URL"),
        (["agents", "--sessions", "1", "--quiet", "--engine-arg=--index-k-dtype=fp4"], "bundled engine exited"),
        (["engine", "serve", "--index-k-dtype", "fp4"], "--index-k-dtype must be fp8 or bf16"),
        (["engine", "serve", "--page-size", "20"], "multiple of the HCA rate"),
        (["engine", "serve", "--fault", "nope"], "unknown fault 'nope'"),
        (["engine", "serve", "--fault", "hicache-index-race"], "fault hicache-index-race needs HiCache (--hicache)"),
        (["agents", "--duration", "5", "--engine-fault", "no-such-fault"], "unknown fault 'no-such-fault'"),
        (
            ["agents", "--url", "http://127.0.0.1:1/v1", "--duration", "5", "--engine-fault", "ghost-decode"],
            "not with --url",
        ),
        (["agents", "--url", "ftp://x", "--sessions", "1"], "--url must be an http(s) URL"),
        (["agents", "--url", "http://127.0.0.1:1/v1", "--sessions", "0"], "--sessions must be at least 1"),
        (["agents", "--url", "http://127.0.0.1:1/v1", "--sessions", "1", "--concurrency", "0"], "--concurrency"),
        (
            ["agents", "--url", "http://127.0.0.1:1/v1", "--sessions", "1", "--scenario", "poetry"],
            "--scenario must be one of",
        ),
        (["agents", "--url", "http://127.0.0.1:1/v1", "--sessions", "1", "--fail-on", "sadness"], "--fail-on takes"),
        (
            ["agents", "--url", "http://127.0.0.1:1/v1", "--sessions", "1", "--reference", "/nonexistent/run"],
            "--reference /nonexistent/run: no such folder",
        ),
        (
            ["agents", "--url", "http://127.0.0.1:1/v1", "--sessions", "1", "--reference", ".", "--temperature", "0.7"],
            "--reference compares greedy answers",
        ),
        (["engine", "train", "--device", "cpu", "--first-seed", "5"], "held out for evaluation"),
        (["engine", "train", "--device", "cpu", "--rename-share", "2"], "--rename-share must be between 0 and 1"),
        (["engine", "train", "--device", "cpu", "--corpus", "/dev/null"], "/dev/null is not a training corpus"),
        (["report", "/nonexistent/run"], "is not a directory"),
        (["probe", "ftp://x"], "probe takes http(s) server roots"),
        (["audit", "/nonexistent/file.jsonl"], "no such file"),
    ],
)
def test_bad_input_is_one_line_exit_2(args, needle):
    r = run_cli(*args)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def test_unreachable_server_is_one_line():
    r = run_cli("agents", "--url", f"http://127.0.0.1:{free_port()}/v1", "--sessions", "1", "--quiet")
    assert r.returncode == 2
    assert "cannot reach" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2


def test_probe_of_an_unreachable_server_exits_2():
    r = run_cli("probe", f"http://127.0.0.1:{free_port()}", "--timeout", "1")
    assert r.returncode == 2 and "unreachable" in r.stdout and "Traceback" not in r.stderr


def test_help_lists_the_commands():
    r = run_cli("--help")
    assert r.returncode == 0
    for cmd in ("agents", "report", "audit", "engine", "probe"):
        assert cmd in r.stdout


def test_engine_faults_lists_every_fault_with_its_bug_class():
    from dsv4bench.engine.faults import FAULTS

    r = run_cli("engine", "faults")
    assert r.returncode == 0
    for name in FAULTS:
        assert name in r.stdout


@pytest.mark.parametrize(
    "command",
    [
        [],
        ["agents"],
        ["locust"],
        ["sweep"],
        ["proxy"],
        ["probe"],
        ["watch"],
        ["report"],
        ["audit"],
        ["engine"],
        ["engine", "serve"],
        ["engine", "train"],
        ["engine", "faults"],
    ],
)
def test_every_help_renders(command):
    r = run_cli(*command, "--help")
    assert r.returncode == 0, r.stderr
    assert "Usage" in r.stdout and "Traceback" not in r.stderr
