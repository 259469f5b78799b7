"""Locust's web UI under `dsv4bench locust` refuses other sites' requests, never takes the run's
plan from its start form, and sends the API key only to the command line's --host.

One `dsv4bench locust` (web UI, no test started) serves the whole module. Its --host is a
loopback sink that records every request's headers; a second sink stands for a host another
party would like the test to run against, and serves the hostile page the browser test opens.
Each test leaves no test running behind it. Locust itself is never imported here (its import
monkey-patches the process for gevent)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from .conftest import ROOT, free_port

pytest.importorskip("flask", reason="Flask is not installed (it comes with the locust extra)")

from dsv4bench.locust import web_guard  # it runs on Flask

from .test_web_ui import CHROMIUM, chromium

KEY = "sk-web-guard-test-key"
EVIL = "http://evil.example"
# What a browser sends with a form another site's page submits to the UI (Chromium's own headers).
CROSS_SITE_FORM = {
    "Origin": EVIL,
    "Sec-Fetch-Site": "cross-site",
    "Sec-Fetch-Mode": "navigate",
    "Sec-Fetch-Dest": "document",
    "Content-Type": "application/x-www-form-urlencoded",
}
# ... and with a fetch() another site's script makes.
CROSS_SITE_FETCH = {"Origin": EVIL, "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "cors", "Sec-Fetch-Dest": "empty"}
needs_locust = pytest.mark.skipif(
    importlib.util.find_spec("locust") is None, reason="Locust is not installed (the locust extra)"
)


# ---- the rules, without a server ---------------------------------------------------------------------

LOOPBACK_UI = "127.0.0.1"


@pytest.mark.parametrize(
    "method,path,headers,host,why",
    [
        # The UI's own page, as Chromium sends its requests: same-origin.
        (
            "POST",
            "/swarm",
            {"Origin": "http://127.0.0.1:8089", "Sec-Fetch-Site": "same-origin"},
            "127.0.0.1:8089",
            None,
        ),
        ("GET", "/stats/requests", {"Sec-Fetch-Site": "same-origin"}, "127.0.0.1:8089", None),
        # Opened at localhost, or through `ssh -L 9000:127.0.0.1:8089`: still the UI's own address.
        (
            "POST",
            "/swarm",
            {"Origin": "http://localhost:9000", "Sec-Fetch-Site": "same-origin"},
            "localhost:9000",
            None,
        ),
        # The two spellings of loopback at the same port are one origin.
        ("POST", "/stop", {"Origin": "http://localhost:8089", "Sec-Fetch-Site": "cross-site"}, "127.0.0.1:8089", None),
        # No browser: curl, scripts.
        ("POST", "/swarm", {}, "127.0.0.1:8089", None),
        ("GET", "/dsv4bench/report", {}, "[::1]:8089", None),
        # A link to the UI followed from another page opens it.
        (
            "GET",
            "/",
            {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"},
            "127.0.0.1:8089",
            None,
        ),
        # Other sites.
        ("POST", "/swarm", CROSS_SITE_FORM, "127.0.0.1:8089", "another origin"),
        (
            "POST",
            "/swarm",
            {"Origin": "http://127.0.0.1:9999", "Sec-Fetch-Site": "same-site"},
            "127.0.0.1:8089",
            "another origin",
        ),
        ("POST", "/swarm", {"Origin": "null", "Sec-Fetch-Site": "cross-site"}, "127.0.0.1:8089", "another origin"),
        ("POST", "/swarm", {"Origin": "https://127.0.0.1:8089"}, "127.0.0.1:8089", "another origin"),
        ("GET", "/dsv4bench/report", CROSS_SITE_FETCH, "127.0.0.1:8089", "another origin"),
        (
            "GET",
            "/stats/requests/csv",
            {"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "no-cors"},
            "127.0.0.1:8089",
            "same-site",
        ),
        (
            "GET",
            "/logs",
            {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "iframe"},
            "127.0.0.1:8089",
            "cross-site",
        ),
        (
            "POST",
            "/",
            {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"},
            "127.0.0.1:8089",
            "cross-site",
        ),
        # A DNS name rebound to 127.0.0.1: "same-origin" for the browser, not our address.
        (
            "POST",
            "/swarm",
            {"Origin": "http://rebound.example:8089", "Sec-Fetch-Site": "same-origin"},
            "rebound.example:8089",
            "not a loopback address",
        ),
        ("POST", "/swarm", {}, "bad host:x", "unreadable Host"),
        # Headers no browser sends: refused, never a traceback.
        ("POST", "/swarm", {"Origin": "http://[::1"}, "127.0.0.1:8089", "another origin"),
        ("POST", "/swarm", {"Origin": "http://127.0.0.1:99999"}, "127.0.0.1:8089", "another origin"),
        ("POST", "/swarm", {"Origin": "http://127.0.0.1:8089/path"}, "127.0.0.1:8089", "another origin"),
        ("POST", "/swarm", {}, "127.0.0.1:99999", "unreadable Host"),
    ],
)
def test_who_the_ui_answers(method, path, headers, host, why):
    found = web_guard.refusal(method, path, headers, "http", host, LOOPBACK_UI)
    assert (found is None) if why is None else (found is not None and why in found), found


def test_a_ui_bound_to_every_interface_answers_its_address_as_the_browser_used_it():
    own = {"Origin": "http://gpu-box.lan:8089", "Sec-Fetch-Site": "same-origin"}
    assert web_guard.refusal("POST", "/swarm", own, "http", "gpu-box.lan:8089", "0.0.0.0") is None
    assert web_guard.refusal("POST", "/swarm", {"Origin": EVIL}, "http", "gpu-box.lan:8089", "0.0.0.0") is not None


def test_the_start_form_keeps_locusts_fields_and_the_per_test_settings_only():
    sent = [
        "user_count",
        "spawn_rate",
        "host",
        "run_time",
        "scenario",
        "max_turns",
        "thinking",
        "seed",
        "dsv4bench_plan",
        "csv_prefix",
        "html_file",
        "dsv4bench_run",
        "dsv4bench_plan",
    ]
    assert web_guard.ignored_fields(sent) == ["dsv4bench_plan", "csv_prefix", "html_file", "dsv4bench_run"]


# ---- a running `dsv4bench locust` -------------------------------------------------------------------------


@dataclass
class Sink:
    """A loopback HTTP server that records each request's path and Authorization header. It
    answers /v1/models (what `dsv4bench locust` asks of its --host), a 503 to every other API
    request, and serves `pages` (path -> HTML)."""

    server: ThreadingHTTPServer
    seen: list[tuple[str, str | None]] = field(default_factory=list)
    pages: dict[str, str] = field(default_factory=dict)

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    def chats(self) -> list[str | None]:
        return [auth for path, auth in list(self.seen) if path.endswith("/chat/completions")]


def start_sink() -> Sink:
    sink: Sink

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            path = self.path.split("?", 1)[0]
            sink.seen.append((path, self.headers.get("Authorization")))
            if path in sink.pages:
                status, body, kind = 200, sink.pages[path].encode(), "text/html"
            elif path.endswith("/models"):
                status, body, kind = 200, b'{"object":"list","data":[{"id":"m","object":"model"}]}', "application/json"
            else:
                time.sleep(0.05)  # the users retry at once: a little pace keeps the machine free
                status, body, kind = 503, b'{"error":"busy"}', "application/json"
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    sink = Sink(server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return sink


@dataclass
class UI:
    base: str
    out: Path
    target: Sink  # the command line's --host
    other: Sink  # a host the command line never named
    log_path: Path

    def log(self, since: int = 0) -> str:
        """Locust's output from offset `since` on (the last 4000 characters without)."""
        text = self.log_path.read_text(errors="replace")
        return text[since:] if since else text[-4000:]

    def log_size(self) -> int:
        return len(self.log_path.read_text(errors="replace"))

    def stats(self) -> dict[str, Any]:
        return httpx.get(f"{self.base}/stats/requests", timeout=5, trust_env=False).json()

    def run_dirs(self) -> set[Path]:
        return set(self.out.iterdir()) if self.out.exists() else set()

    def wait(self, what: str, check: Any, timeout: float = 20.0) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if value := check():
                return value
            time.sleep(0.2)
        raise AssertionError(f"{what}: not within {timeout} s\n{self.log()}")

    def stop_test(self) -> None:
        """Stop a running test and wait for its report (the next test waits for it anyway)."""
        # NOTE: always: Locust serves /stats/requests from a cache of a few seconds, whose state
        # can be from before the start.
        httpx.post(f"{self.base}/stop", timeout=10, trust_env=False)
        self.wait("the test stopped", lambda: self.stats()["state"] in ("stopped", "ready"))

    def assert_nothing_started(self, before: set[Path], chats_before: int) -> None:
        # A swarm that was let through makes its folder and first requests by now (Locust's
        # cached state would say so only later).
        time.sleep(1.0)
        assert self.run_dirs() == before, self.log()
        assert len(self.other.chats()) == chats_before


@pytest.fixture(scope="module")
def locust_ui(tmp_path_factory) -> Iterator[UI]:
    if importlib.util.find_spec("locust") is None:
        pytest.skip("Locust is not installed (the locust extra)")
    tmp = tmp_path_factory.mktemp("web-guard")
    target, other = start_sink(), start_sink()
    port, out = free_port(), tmp / "runs"
    log_path = tmp / "locust.log"
    log = open(log_path, "w")
    env = {k: v for k, v in os.environ.items() if k != "DSV4BENCH_API_KEY"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dsv4bench",
            "locust",
            "--host",
            f"{target.root}/v1",
            "--api-key",
            KEY,
            "--web-port",
            str(port),
            "--max-turns",
            "2",
            "--ttft-timeout",
            "2",
            "--total-timeout",
            "5",
            "--out",
            str(out),
            "--quiet",
        ],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    ui = UI(f"http://127.0.0.1:{port}", out, target, other, log_path)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, ui.log()
            assert time.monotonic() < deadline, f"Locust's web UI never answered\n{ui.log()}"
            try:
                if httpx.get(f"{ui.base}/", timeout=1, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        yield ui
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        log.close()
        target.server.shutdown()
        other.server.shutdown()


@pytest.fixture
def ui(locust_ui: UI) -> Iterator[UI]:
    """The module's UI, and after the test no test of it left running: one a test started (or
    let through) is stopped and its report awaited, so the next test starts from rest."""
    ui = locust_ui
    before = ui.run_dirs()
    yield ui
    # NOTE: a stop even with no new folder under --out: a test let through may write elsewhere.
    httpx.post(f"{ui.base}/stop", timeout=10, trust_env=False)
    if started := ui.run_dirs() - before:
        ui.stop_test()
        for run_dir in started:
            ui.wait("the report", lambda: (run_dir / "report.md").exists())


def hostile_form(ui: UI, tmp: Path) -> dict[str, str]:
    """What another party's start form would send: its host, and a plan of its own whose run
    folder is elsewhere and whose metrics URL is its own."""
    plan = {
        "config": {
            "url": f"{ui.other.root}/v1",
            "out": str(tmp / "elsewhere"),
            "metrics": [f"{ui.other.root}/metrics"],
        },
        "model": "m",
        "facts": {},
        "command": "x",
    }
    return {
        "user_count": "1",
        "spawn_rate": "1",
        "host": f"{ui.other.root}/v1",
        "dsv4bench_plan": json.dumps(plan),
        "csv_prefix": str(tmp / "elsewhere" / "stats"),
    }


def test_a_cross_site_start_is_refused_and_starts_nothing(ui, tmp_path):
    before, chats = ui.run_dirs(), len(ui.other.chats())
    r = httpx.post(
        f"{ui.base}/swarm", data=hostile_form(ui, tmp_path), headers=CROSS_SITE_FORM, timeout=10, trust_env=False
    )
    assert r.status_code == 403
    assert "access-control-allow-origin" not in r.headers
    for path in ("/stop", "/stats/reset"):
        assert httpx.post(f"{ui.base}{path}", headers=CROSS_SITE_FORM, timeout=10, trust_env=False).status_code == 403
    ui.assert_nothing_started(before, chats)
    assert not (tmp_path / "elsewhere").exists()


@pytest.mark.parametrize("path", ["/dsv4bench/report", "/stats/requests", "/logs", "/stats/requests/csv"])
def test_a_cross_site_read_is_refused_with_no_cors_grant(ui, path):
    r = httpx.get(f"{ui.base}{path}", headers=CROSS_SITE_FETCH, timeout=10, trust_env=False)
    assert r.status_code == 403
    assert "access-control-allow-origin" not in r.headers
    preflight = httpx.options(
        f"{ui.base}{path}",
        timeout=10,
        trust_env=False,
        headers={**CROSS_SITE_FETCH, "Access-Control-Request-Method": "GET", "Access-Control-Request-Headers": "x-any"},
    )
    assert "access-control-allow-origin" not in preflight.headers
    # The same read with no browser's headers (curl, a script): answered, still with no grant.
    plain = httpx.get(f"{ui.base}{path}", timeout=10, trust_env=False)
    assert plain.status_code == 200 and "access-control-allow-origin" not in plain.headers


def test_a_host_named_in_the_form_gets_no_key_and_the_plan_in_the_form_is_ignored(ui, tmp_path):
    before, chats = ui.run_dirs(), len(ui.other.chats())
    # No browser's headers: the form itself is what is under test here.
    r = httpx.post(f"{ui.base}/swarm", data=hostile_form(ui, tmp_path), timeout=10, trust_env=False)
    assert r.status_code == 200 and r.json()["success"], r.text
    try:
        (run_dir,) = ui.wait("the run folder", lambda: ui.run_dirs() - before)
        ui.wait("requests at the form's host", lambda: len(ui.other.chats()) > chats)
        assert run_dir.parent == ui.out  # the command line's --out, not the form's plan's
        assert set(ui.other.chats()[chats:]) == {None}  # no Authorization header at all
        assert not (tmp_path / "elsewhere").exists()
        assert not [path for path, _ in ui.other.seen if path.endswith("/metrics")]  # the form's plan's scrape
        events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
        (changed,) = [e for e in events if e["kind"] == "host_changed"]
        assert (changed["host"], changed["command_line_host"], changed["key_sent"], changed["key_given"]) == (
            f"{ui.other.root}/v1",
            f"{ui.target.root}/v1",
            False,
            True,
        )
        rows = next(t["data"] for t in ui.stats()["extended_stats"] if t["key"] == "dsv4bench-verdicts")
        said = {r["code"]: r["meaning"] for r in rows}
        assert "the API key is not sent to it" in said["(notice)"] and ui.other.root in said["(notice)"]
        assert "'dsv4bench_plan'" in said["(web UI)"] and "'csv_prefix'" in said["(web UI)"]
        logs = "\n".join(httpx.get(f"{ui.base}/logs", timeout=5, trust_env=False).json()["master"])
        assert "were ignored" in logs
    finally:
        ui.stop_test()
    ui.wait("the report", lambda: (run_dir / "report.md").exists())
    page = httpx.get(f"{ui.base}/dsv4bench/report", timeout=10, trust_env=False).text
    assert "the API key is not sent to it" in page
    assert KEY not in (run_dir / "run.json").read_text()


def test_the_command_line_host_still_gets_the_key(ui):
    before, chats = ui.run_dirs(), len(ui.target.chats())
    r = httpx.post(
        f"{ui.base}/swarm",
        timeout=10,
        trust_env=False,
        data={"user_count": "1", "spawn_rate": "1", "host": f"{ui.target.root}/v1"},
    )
    assert r.status_code == 200 and r.json()["success"], r.text
    try:
        (run_dir,) = ui.wait("the run folder", lambda: ui.run_dirs() - before)
        ui.wait("requests at --host", lambda: len(ui.target.chats()) > chats)
        assert set(ui.target.chats()[chats:]) == {f"Bearer {KEY}"}
    finally:
        ui.stop_test()
    events = (run_dir / "events.jsonl").read_text()
    assert "host_changed" not in events


# ---- in a real browser ----------------------------------------------------------------------------------

needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed (Debian: apt-get install chromium)")

# Another party's page: it tries to read the UI's data, then posts the start form into a hidden
# frame, as a page does that wants to stay on screen while it works.
ATTACK = """<!doctype html><html><body>
<iframe name="sink" style="display:none"></iframe>
<form id="f" method="POST" action="{ui}/swarm" target="sink">{fields}</form>
<script>
(async () => {{
  const read = async (path) => {{
    try {{ const r = await fetch("{ui}" + path); return path + ":read " + r.status; }}
    catch (e) {{ return path + ":blocked"; }}
  }};
  const reads = "read " + (await Promise.all(["/stats/requests", "/dsv4bench/report"].map(read))).join(" ");
  document.querySelector("iframe").onload = () => {{ document.title = reads + " | sent"; }};
  document.getElementById("f").submit();
}})();
</script></body></html>"""


@needs_chromium
@needs_locust
def test_another_pages_form_and_fetches_get_nothing_in_a_browser(ui, tmp_path):
    fields = "".join(
        f'<input type="hidden" name="{k}" value="{v.replace(chr(34), "&quot;")}">'
        for k, v in hostile_form(ui, tmp_path).items()
    )
    ui.other.pages["/attack"] = ATTACK.format(ui=ui.base, fields=fields)
    before, chats, mark = ui.run_dirs(), len(ui.other.chats()), ui.log_size()
    with chromium(tmp_path) as page:
        page.call("Page.navigate", url=f"{ui.other.root}/attack")
        title = page.wait_for("document.title.endsWith(' | sent') && document.title", "the page's reads and form")
        assert title == "read /stats/requests:blocked /dsv4bench/report:blocked | sent", title
    ui.assert_nothing_started(before, chats)
    assert "refused POST /swarm" in ui.log(mark)  # the form did reach the UI, and was refused


@needs_chromium
@needs_locust
def test_the_uis_own_page_still_starts_a_test_in_a_browser(ui, tmp_path):
    before, chats, mark = ui.run_dirs(), len(ui.target.chats()), ui.log_size()
    with chromium(tmp_path) as page:
        form = "document.querySelector('input[name=\"userCount\"]')"
        new = "[...document.querySelectorAll('button')].some(b => b.textContent.trim() === 'New')"
        page.open(f"{ui.base}/", f"{form} || {new}", "the start form or New")
        if not page.evaluate(f"!!{form}"):  # an earlier test of this UI has run: its form is behind New
            page.click_text("button", "New")
            page.wait_for(f"!!{form}", "the start form")
        page.fill("userCount", "1")
        page.fill("spawnRate", "1")
        page.click_text("button[type=submit]", "Start")
        try:
            ui.wait("the run folder", lambda: ui.run_dirs() - before)
            ui.wait("requests at --host", lambda: len(ui.target.chats()) > chats)
            assert set(ui.target.chats()[chats:]) == {f"Bearer {KEY}"}
            page.click_text("button", "Stop")
            ui.wait("the test stopped", lambda: ui.stats()["state"] == "stopped")
        finally:
            ui.stop_test()
    # Everything Locust's own page sends is a field the UI keeps.
    assert "were ignored" not in ui.log(mark) and "refused" not in ui.log(mark), ui.log(mark)
