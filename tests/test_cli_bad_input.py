"""Every bad input to the CLI is one clear line on stderr and exit 2, before anything starts:
no traceback, no run folder, no engine. In-process (typer's runner) so the table stays cheap;
tests/test_cli.py runs the same manners through a real subprocess."""

from __future__ import annotations

import os

import pytest

from tests.cli_output import assert_one_line_exit_2, invoke

DEAD = "http://127.0.0.1:1/v1"  # nothing listens on port 1: a check that got as far as connecting fails there


@pytest.mark.parametrize(
    "args,needle",
    [
        # URLs that do not parse, or name no host or an impossible port
        (["agents", "--url", "http://[::1", "--sessions", "1"], "is not a valid URL"),
        (["agents", "--url", "http://h:abc/v1", "--sessions", "1"], "is not a valid URL"),
        (["agents", "--url", "http:///v1", "--sessions", "1"], "names no host"),
        (["agents", "--url", "http://127.0.0.1:99999/v1", "--sessions", "1"], "port 99999 is not a port number"),
        (["agents", "--url", DEAD, "--sessions", "1", "--metrics", "http://[::1/metrics"], "--metrics"),
        # request mixes that cannot be drawn from
        (
            ["agents", "--url", DEAD, "--request-mix", "fastest"],
            "--request-mix 'fastest' 'fastest' is neither a preset",
        ),
        (["agents", "--url", DEAD, "--request-mix", "thinking=max;tool_choice=named"], "thinking mode refuses"),
        (["agents", "--url", DEAD, "--request-mix", "frameworks", "--thinking"], "--thinking is drawn per turn"),
        (["sweep", "--url", DEAD, "--concurrency", "1,2", "--request-mix", "stop=sometimes"], "stop='sometimes'"),
        # numbers typer accepts that no run can use
        (["agents", "--url", DEAD, "--duration", "nan"], "--duration must be a finite number"),
        (["agents", "--url", DEAD, "--duration", "inf"], "--duration must be a finite number"),
        (["agents", "--url", DEAD, "--sessions", "1", "--rate", "nan"], "--rate must be a finite number"),
        (["agents", "--url", DEAD, "--sessions", "1", "--ttft-timeout", "inf"], "--ttft-timeout must be a finite"),
        (["agents", "--url", DEAD, "--sessions", "1", "--drain-timeout", "nan"], "--drain-timeout must be a finite"),
        (["agents", "--url", DEAD, "--sessions", "1", "--temperature", "-1"], "--temperature must be between 0 and 2"),
        (["agents", "--url", DEAD, "--sessions", "1", "--temperature", "2.5"], "--temperature must be between 0 and 2"),
        (["agents", "--url", DEAD, "--sessions", "1", "--temperature", "nan"], "--temperature must be a finite"),
        (["agents", "--url", DEAD, "--sessions", "1", "--serve-metrics", "70000"], "--serve-metrics must be a port"),
        (["agents", "--url", DEAD, "--sessions", "1", "--max-turns", "0"], "--max-turns must be at least 1"),
        (["agents", "--url", DEAD, "--concurrency", "100000000"], "open files"),
        # folders a run cannot write
        (
            ["agents", "--url", DEAD, "--sessions", "1", "--out", "/proc/forbidden"],
            "--out /proc/forbidden: cannot write",
        ),
        (["agents", "--url", DEAD, "--sessions", "1", "--out", "/etc/passwd"], "--out /etc/passwd is a file"),
        # the bundled engine's flags
        (["engine", "serve", "--port", "70000"], "--port must be a port number"),
        (["engine", "serve", "--port", "0"], "--port must be a port number"),
        (["engine", "serve", "--pd", "--prefill-port", "65536"], "port"),
        (["engine", "serve", "--pd", "--pd-link-gbps", "nan"], "--pd-link-gbps must be a finite number"),
        (["engine", "serve", "--hicache", "--hicache-load-gbps", "inf"], "--hicache-load-gbps must be a finite"),
        (["engine", "serve", "--pd-role", "router"], "--pd-role must be prefill or decode"),
        (["engine", "serve", "--pd-role", "decode", "--pd"], "not with --pd"),
        (["engine", "serve", "--pd-role", "decode", "--bootstrap-port", "8998"], "needs --pd or --pd-role prefill"),
        (["engine", "serve", "--router", "nginx"], "--router must be bundled or sglang"),
        (["engine", "serve", "--worker-port", "30001"], "--worker-port is the engine's behind --router sglang"),
        (["engine", "serve", "--pd", "--router-metrics-port", "29000"], "it needs --router sglang"),
        (
            ["engine", "serve", "--pd", "--router", "sglang", "--router-metrics-port", "70000"],
            "--router-metrics-port must be a port number",
        ),
        (["engine", "serve", "--pd", "--bootstrap-port", "30000"], "ports must differ"),
        (
            ["engine", "serve", "--pd-role", "prefill", "--bootstrap-port", "0"],
            "--bootstrap-port must be a port number",
        ),
        (["engine", "serve", "--pd-role", "prefill", "--port", "8998"], "--port and --bootstrap-port must differ"),
        (["engine", "serve", "--prefill-port", "30000"], "need --pd"),
        (["engine", "serve", "--tool-call-parser", "vllm"], "--tool-call-parser must be deepseek-recipe or sglang"),
        # probe and watch
        (["probe", "http://[::1"], "is not a valid URL"),
        (["probe", "http://127.0.0.1:99999"], "port 99999 is not a port number"),
        (["probe", "--timeout", "nan", "http://127.0.0.1:1"], "--timeout must be a positive number"),
        (["watch", "http://[::1/metrics"], "is not a valid URL"),
        (["watch", "--duration", "inf", "http://127.0.0.1:1/metrics"], "must be positive numbers"),
        # a --fail-on that would gate on nothing (an unset variable in a CI script)
        (["agents", "--url", DEAD, "--sessions", "1", "--fail-on", ""], "--fail-on names no condition (got '')"),
        (["sweep", "--url", DEAD, "--concurrency", "1,2", "--fail-on", " , "], "--fail-on names no condition"),
        (["proxy", "--upstream", DEAD, "--fail-on", ","], "--fail-on names no condition"),
        (["audit", "/tmp", "--fail-on", ""], "--fail-on names no condition"),
        # files that are not what the command reads
        (["audit", "/tmp"], "is a folder"),
        (["report", "/etc/passwd"], "is not a directory"),
    ],
)
def test_bad_input_is_one_line_exit_2(args, needle):
    assert_one_line_exit_2(invoke(*args), needle)


def test_out_in_a_read_only_folder(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("running as a user who may write anywhere (root)")
        assert_one_line_exit_2(
            invoke("agents", "--url", DEAD, "--sessions", "1", "--out", str(locked / "runs")), "cannot write there"
        )
    finally:
        locked.chmod(0o700)


def test_audit_of_a_binary_file(tmp_path):
    f = tmp_path / "capture.jsonl"
    f.write_bytes(bytes(range(256)) * 40)
    assert_one_line_exit_2(invoke("audit", str(f)), "holds no readable exchange")


def test_audit_of_a_torn_file_says_so_after_auditing_what_it_could(tmp_path):
    f = tmp_path / "capture.jsonl"
    good = (
        '{"request": {"messages": []}, "response": {"choices": [{"index": 0, "message": '
        '{"role": "assistant", "content": "fine"}, "finish_reason": "stop"}]}}'
    )
    f.write_text(good + "\n" + good[:40])
    r = invoke("audit", str(f))
    assert "2 exchanges" in r.stdout  # the readable line was audited and shown
    assert_one_line_exit_2(r, "1 of 2 lines could not be audited (first: line 2")


def test_audit_of_a_file_that_is_not_utf8_json(tmp_path):
    f = tmp_path / "capture.jsonl"
    f.write_bytes(b'{"request": {}, "response": "\xff\xfe"}\n')
    assert_one_line_exit_2(invoke("audit", str(f)), "holds no readable exchange")


def test_no_sessions_and_no_duration_plays_one_session_per_slot(tmp_path):
    # Stops at the unreachable server, after the config was built: the notice comes first.
    r = invoke("agents", "--url", DEAD, "--concurrency", "7", "--out", str(tmp_path))
    assert r.exit_code == 2
    assert "one whole session per slot (--sessions 7)" in r.stderr
    assert "cannot reach" in r.stderr


def test_out_is_created_when_missing(tmp_path):
    target = tmp_path / "a" / "b"
    r = invoke("agents", "--url", DEAD, "--sessions", "1", "--out", str(target))
    assert r.exit_code == 2 and "cannot reach" in r.stderr  # got past the --out check
    assert target.is_dir() and not list(target.iterdir())  # and its write check left nothing behind


def test_sessions_default_only_without_duration():
    from dsv4bench.harness.config import RunConfig

    assert RunConfig(url=DEAD, concurrency=5).sessions == 5
    assert RunConfig(url=DEAD, concurrency=5, duration=30.0).sessions is None  # bounded by time alone
    assert RunConfig(url=DEAD, concurrency=5, sessions=2).sessions == 2


def test_engine_serve_on_a_busy_port_is_one_line_before_any_serving():
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = invoke("engine", "serve", "--port", str(port))
    assert_one_line_exit_2(r, f"cannot serve on 127.0.0.1:{port}")
    assert "serving on" not in r.stdout + r.stderr


def test_engine_serve_on_a_host_that_does_not_resolve():
    assert_one_line_exit_2(invoke("engine", "serve", "--host", "999.1.1.1"), "cannot serve on 999.1.1.1")


def test_auth_health_metrics_needs_a_key():
    assert_one_line_exit_2(invoke("engine", "serve", "--auth-health-metrics"), "--auth-health-metrics needs --api-key")
