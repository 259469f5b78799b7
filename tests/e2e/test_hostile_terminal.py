"""End to end: what a hostile server or client says reaches the terminal as visible text.

The hostile server (tests/fixtures/hostile_server.py --terminal-text) puts a screen clear, an
OSC 52 clipboard write, an OSC 8 link, a CR, a right-to-left override and rich markup into its
model id, /get_server_info, /metrics labels, response ids and answers; a proxied client puts them
into its `user`. No command may print them raw: no ESC byte, CR or bidi control in stdout or
stderr, and the text still there, escaped, where the command shows it."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import time

import httpx
import pytest
from rich.console import Console

from dsv4bench.servers.monitor import MetricSample
from dsv4bench.terminal import markup_safe, visible, visible_text
from dsv4bench.servers.watch import WatchState, render_watch

from .conftest import ROOT, free_port, only_run_dir, run_cli, start_fixture_server

sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
from hostile_server import TERMINAL_TEXT

# Raw: ESC, BEL, CR, the C1 CSI and OSC, and the bidi controls.
_RAW = re.compile("[\x1b\x07\r\x9b\x9d\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
# How the text reads once made visible (a rich Text drops BEL and CR itself, so they may be gone).
SHOWN = "\\x1b[2J \\x1b]52;c;ZXZpbA=="


def _clean(text: str, where: str) -> None:
    m = _RAW.search(text)
    assert m is None, f"{where}: raw {m.group()!r} at {text[max(0, m.start() - 80) : m.end() + 80]!r}"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = start_fixture_server(
        "hostile_server.py", tmp_path_factory.mktemp("term"), "/health", "--modes", "normal", "--terminal-text"
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def agents_run(server, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    r = run_cli(
        "agents",
        "--url",
        f"{server.root}/v1",
        "--sessions",
        "2",
        "--max-turns",
        "1",
        "--concurrency",
        "2",
        "--ttft-timeout",
        "5",
        "--total-timeout",
        "10",
        "--out",
        str(out),
        timeout=120,
    )
    return r, only_run_dir(out)


def test_agents_prints_the_servers_text_visibly(agents_run):
    r, _ = agents_run
    assert "Traceback" not in r.stderr, r.stderr
    _clean(r.stdout, "agents stdout")
    _clean(r.stderr, "agents stderr")
    assert SHOWN in r.stderr  # the deployment's settings, as /get_server_info said them
    assert "[link=http://evil]x[/l" in r.stderr  # markup printed as text, not read (settings are clipped)


def test_audit_prints_the_servers_text_visibly(agents_run):
    _, run_dir = agents_run
    r = run_cli("audit", str(run_dir / "turns.jsonl"))
    assert "Traceback" not in r.stderr, r.stderr
    _clean(r.stdout, "audit stdout")
    _clean(r.stderr, "audit stderr")
    assert SHOWN in r.stdout and "[link=http://evil]x[/link]" in r.stdout  # response ids, verdict details


def test_probe_prints_the_servers_text_visibly(server):
    r = run_cli("probe", server.root, "--timeout", "5", "--stuck-s", "0.5", timeout=120)
    assert "Traceback" not in r.stderr, r.stderr
    _clean(r.stdout, "probe stdout")
    _clean(r.stderr, "probe stderr")
    assert SHOWN in r.stdout and "[link=http://evil]x[/l" in r.stdout  # its settings, clipped


def test_watch_prints_nothing_raw(server):
    r = run_cli("watch", f"{server.root}/metrics", "--duration", "1.5", "--interval", "0.5", timeout=60)
    assert "Traceback" not in r.stderr, r.stderr
    _clean(r.stdout, "watch stdout")
    _clean(r.stderr, "watch stderr")
    assert "127.0.0.1" in r.stderr  # the view was drawn


def test_watch_view_shows_a_servers_error_visibly():
    state = WatchState(stuck_s=5)
    state.add(MetricSample(1, 1, "http://h:1/metrics", ok=False, error=TERMINAL_TEXT, status=500))
    buf = io.StringIO()
    Console(file=buf, width=200, force_terminal=False).print(render_watch(state, now_ns=2, width=200))
    _clean(buf.getvalue(), "watch view")
    assert SHOWN in buf.getvalue() and "[link=http://evil]x[/link]" in buf.getvalue()


def test_proxy_logs_a_clients_user_visibly(tmp_path):
    upstream = start_fixture_server("hostile_server.py", tmp_path, "/health", "--default-mode", "http_500")
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dsv4bench",
            "proxy",
            "--upstream",
            f"{upstream.root}/v1",
            "--port",
            str(port),
            "--duration",
            "6",
            "--out",
            str(tmp_path / "runs"),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                httpx.post(
                    f"http://127.0.0.1:{port}/v1/chat/completions",
                    timeout=5,
                    json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "user": TERMINAL_TEXT},
                )
                break
            except httpx.TransportError:
                time.sleep(0.2)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
        upstream.stop()
    assert "Traceback" not in stderr, stderr
    _clean(stdout, "proxy stdout")
    _clean(stderr, "proxy stderr")
    assert f"session {visible(TERMINAL_TEXT)[:30]}" in stderr, stderr


def test_visible_escapes_controls_and_keeps_text():
    assert (
        visible("a\x1b[2Jb\x07\r\n\x9b\u202e\u2066\u200e\x7f")
        == "a\\x1b[2Jb\\x07\\x0d\\x0a\\x9b\\u202e\\u2066\\u200e\\x7f"
    )
    assert visible("tab\tok 数据库 ✅ [x]") == "tab\tok 数据库 ✅ [x]"
    assert markup_safe("[link=http://evil]x[/link]") == "\\[link=http://evil]x\\[/link]"


def test_visible_text_keeps_styles():
    from rich.text import Text

    t = Text("ok ")
    t.append("\x1b[2J", style="red")
    t.append(" end", style="bold")
    safe = visible_text(t)
    assert safe.plain == "ok \\x1b[2J end"
    assert [(s.start, s.end, str(s.style)) for s in safe.spans] == [(3, 10, "red"), (10, 14, "bold")]
