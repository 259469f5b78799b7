"""The dsv4bench tabs of Locust's web UI: their rows from a hand-made tally and watch state, the
report page and its plots on a bare Flask app, and the UI itself in headless Chromium against
the known-bad replay server, its verdicts table held to the run folder's history.

The browser is driven over the Chrome DevTools Protocol through simple-websocket, which Locust
already installs (python-socketio -> python-engineio -> simple-websocket); Locust itself is never
imported here, since its import monkey-patches the process for gevent."""

from __future__ import annotations

import base64
import importlib.util
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from dsv4bench.history.codes import meaning
from dsv4bench.history.run_folder import read_history
from dsv4bench.locust.recorder import Tally
from dsv4bench.history.records import AssembledResponse, Timings, ToolCall, TurnRecord, TurnStatus, Verdict
from dsv4bench.report.counting import tool_call_count, turn_codes

from .conftest import ROOT, free_port, start_replay

# Flask, which the web UI and these tabs run on, comes with Locust (the locust extra).
pytest.importorskip("flask", reason="Flask is not installed (it comes with the locust extra)")
from flask import Blueprint, Flask, jsonify  # only once it is known to be there

from dsv4bench.locust import web_tab  # it runs on Flask

SCRIPT = "<script>alert(1)</script>"


def turn(
    session: str,
    n: int,
    status: str = "ok",
    calls: int = 1,
    verdicts: tuple[tuple[str, str], ...] = (),
    error: str | None = None,
) -> TurnRecord:
    """A turn record as a Locust user records one; `verdicts` are (code, detail) pairs."""
    response = None
    if status in ("ok", "killed"):
        response = AssembledResponse(
            content="",
            finish_reason="tool_calls" if calls else "stop",
            saw_done=True,
            tool_calls=[ToolCall(i, f"call_{i}", "read_file", "{}") for i in range(calls)],
        )
    return TurnRecord(
        run="r",
        session=session,
        turn=n,
        scenario="coding",
        seed=0,
        status=TurnStatus(status),
        timings=Timings(),
        error=error,
        response=response,
        verdicts=[Verdict(code, detail) for code, detail in verdicts],
    )


def hand_made_tally() -> Tally:
    tally = Tally()
    tally.add(turn("s00000", 0, calls=2, verdicts=(("dsml_leak_content", SCRIPT),)))
    tally.add(turn("s00000", 1, calls=1))
    tally.add(turn("s00001", 0, calls=1, verdicts=(("dsml_leak_content", "bidi \u202eoverride"),)))
    tally.add(
        turn(
            "s00001", 1, status="error", calls=0, verdicts=(("http_error", "HTTP 500: <b>down</b>"),), error="HTTP 500"
        )
    )
    tally.add(turn("s00002", 0, status="killed", calls=1))
    return tally


def cells_are_scalars(rows: list[dict[str, Any]]) -> bool:
    """Locust's page puts a cell's value into the DOM as a React child: a dict or list there
    breaks the page."""
    return all(v is None or isinstance(v, (str, int, float)) for r in rows for v in r.values())


# ---- the rows --------------------------------------------------------------------------------------


def test_verdict_rows_count_as_the_tally_and_show_the_test_and_its_report():
    test = web_tab.ShownTest("run-1", Path("/runs/run-1"), "running")
    rows = web_tab.verdict_rows(hand_made_tally(), test, "/dsv4bench/report")
    by_code = {r["code"]: r for r in rows}
    assert [r["code"] for r in rows] == [
        "(test)",
        "(report)",
        "(turns)",
        "(ok)",
        "(killed)",
        "(tool calls)",
        "dsml_leak_content",
        "http_error",
    ]
    assert "run-1: running" in by_code["(test)"]["meaning"] and "/runs/run-1" in by_code["(test)"]["meaning"]
    assert "/dsv4bench/report" in by_code["(report)"]["meaning"]
    assert {k: by_code[k]["count"] for k in ("(turns)", "(ok)", "(killed)", "(tool calls)")} == {
        "(turns)": 5,
        "(ok)": 3,
        "(killed)": 1,
        "(tool calls)": 4,
    }
    leak = by_code["dsml_leak_content"]
    # corruption: per completed turn (2 of 3) and per tool call (2 of 4)
    assert (leak["family"], leak["count"], leak["per_turn"], leak["per_tool_call"]) == (
        "corruption",
        2,
        "66.67%",
        "50.00%",
    )
    http = by_code["http_error"]
    # availability: per attempted turn, the killed one not counted (1 of 4); no per-call rate
    assert (http["family"], http["count"], http["per_turn"], http["per_tool_call"]) == ("availability", 1, "25.00%", "")
    assert leak["meaning"] == meaning("dsml_leak_content")
    assert cells_are_scalars(rows)


def test_with_slo_the_verdicts_tab_gives_the_turns_meeting_the_targets_and_the_goodput():
    from dsv4bench.report.slo import SloTargets, tally_for
    from tests.report.test_slo import turn as timed_turn

    tally = Tally(slo=tally_for(SloTargets.parse("ttft=500ms,e2e=2s")))
    for t in (
        timed_turn(start_s=0.0, ttft_s=0.1, e2e_s=1.0, tokens=30),  # met
        timed_turn(start_s=1.0, ttft_s=0.9, e2e_s=1.0, tokens=30),  # ttft missed
        timed_turn(start_s=2.0, ttft_s=0.1, e2e_s=2.0, tokens=50),  # met, ends at 4 s
        timed_turn(start_s=2.5, status="killed"),  # not counted
    ):
        tally.add(t)
    test = web_tab.ShownTest("run-1", Path("/runs/run-1"), "running")
    rows = {r["code"]: r for r in web_tab.verdict_rows(tally, test, "/dsv4bench/report")}
    slo = rows["(slo)"]
    assert (slo["count"], slo["per_turn"]) == (2, "66.67%")
    # Over the turns' own span, 0 s to 4 s: 2 turns and 80 tokens.
    assert "(ttft=500ms,e2e=2s) of the 3 counted" in slo["meaning"]
    assert "goodput 0.50 turns/s, 20.0 output tokens/s over the turns' 4.00 s" in slo["meaning"]
    assert cells_are_scalars(list(rows.values()))
    assert "(slo)" not in {r["code"] for r in web_tab.verdict_rows(hand_made_tally(), test, "/r")}


def test_example_rows_carry_server_text_as_text_made_visible():
    rows = web_tab.example_rows(hand_made_tally())
    assert [(r["code"], r["session"], r["turn"]) for r in rows] == [
        ("dsml_leak_content", "s00001", 0),
        ("dsml_leak_content", "s00000", 0),
        ("http_error", "s00001", 1),
    ]
    # A detail the server wrote: a string, shown by the page as text, never parsed as HTML.
    assert rows[1]["what"] == SCRIPT
    assert rows[0]["what"] == "bidi \\u202eoverride"  # the override made visible, not obeyed
    assert rows[2]["what"] == "HTTP 500: <b>down</b>"
    assert cells_are_scalars(rows)


def test_server_rows_during_the_load_then_with_the_wedge_findings():
    metrics, bad, canary = "http://127.0.0.1:1/metrics", "http://127.0.0.1:2/metrics", "http://127.0.0.1:1/v1"
    state = {
        "phase": "load",
        "wedge": None,
        "endpoints": {
            metrics: {
                "ok": True,
                "error": None,
                "queues": {'sglang:num_queue_reqs{tp="0"}': 3, "sglang:num_running_reqs": 0},
            },
            bad: {"ok": False, "error": f"HTTP 502: {SCRIPT}", "queues": {}},
        },
    }
    test = web_tab.ShownTest("run-1", Path("/runs/run-1"), "running")
    rows = web_tab.server_rows(state, web_tab.findings_of(Path("/nonexistent"), state), test)
    assert [(r["endpoint"], r["phase"], r["scrape"], r["queues"], r["verdict"]) for r in rows] == [
        (metrics, "load", "ok", "num_queue_reqs=3", "judged after the drain and checks"),
        (bad, "load", f"failed: HTTP 502: {SCRIPT}", "–", "judged after the drain and checks"),
    ]

    state["phase"] = "done"
    state["wedge"] = {
        metrics: {
            "codes": ["queue_stuck"],
            "gauges": {"sglang:num_queue_reqs": 3},
            "drain_s": None,
            "details": ["num_queue_reqs stayed 3 for 10.0 s"],
        },
        bad: {"codes": [], "gauges": {"sglang:num_queue_reqs": 0}, "drain_s": 1.5, "details": []},
        canary: {
            "codes": ["canary_timeout", "health_lies"],
            "gauges": {},
            "drain_s": None,
            "details": [f"canary on {canary} failed after 5.0 s: {SCRIPT}"],
            "canary": {"ok": False, "result": "timeout", "http_status": None, "latency_s": 5.0, "error": None},
        },
    }
    rows = {
        r["endpoint"]: r for r in web_tab.server_rows(state, web_tab.findings_of(Path("/nonexistent"), state), test)
    }
    assert list(rows) == [metrics, bad, canary]
    assert (rows[metrics]["drain"], rows[metrics]["canary"], rows[metrics]["health"], rows[metrics]["verdict"]) == (
        "did not drain",
        "–",
        "no lie found",
        "queue_stuck: num_queue_reqs stayed 3 for 10.0 s",
    )
    assert (rows[bad]["drain"], rows[bad]["verdict"]) == ("drained in 1.50 s", "healthy")
    assert (rows[canary]["scrape"], rows[canary]["canary"], rows[canary]["health"]) == (
        "",
        "hung in 5.00 s",
        "lied: 200 while requests hung",
    )
    assert (
        rows[canary]["verdict"].startswith("canary_timeout, health_lies: canary on")
        and SCRIPT in rows[canary]["verdict"]
    )
    assert cells_are_scalars(list(rows.values()))


def test_server_rows_say_why_there_are_none():
    test = web_tab.ShownTest("run-1", Path("/runs/run-1"), "running")
    assert "no --metrics endpoint" in web_tab.server_rows(None, {}, test)[0]["verdict"]
    assert web_tab.server_rows(None, {}, None)[0]["verdict"] == "no test has started yet"


def test_findings_come_from_run_json_once_there_is_no_watch(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"wedge": {"http://h/metrics": {"codes": ["queue_stuck"]}}}))
    assert web_tab.findings_of(tmp_path, None)["http://h/metrics"]["codes"] == ["queue_stuck"]
    assert web_tab.findings_of(tmp_path, {"phase": "drain", "endpoints": {}}) == {}


# ---- the routes, on a bare Flask app standing in for Locust's -----------------------------------------


class FakeEvent:
    def __init__(self) -> None:
        self.listeners: list[Any] = []

    def add_listener(self, f: Any) -> None:
        self.listeners.append(f)


def fake_locust(lifecycle: Any) -> tuple[Flask, dict[str, Any]]:
    """A Flask app with Locust's /stats/requests view (blueprint `locust`), the tabs installed."""
    app = Flask("fake-locust")
    locust = Blueprint("locust", __name__)

    memo: dict[str, Any] = {}

    @locust.route("/stats/requests")
    def request_stats():  # memoized as Locust's is: the same Response object every time
        if "response" not in memo:
            memo["response"] = jsonify({"stats": [{"name": "Aggregated"}], "errors": [], "state": "running"})
        return memo["response"]

    app.register_blueprint(locust)
    web_ui = SimpleNamespace(app=app, template_args={}, auth_required_if_enabled=lambda view: view)
    env = SimpleNamespace(
        web_ui=web_ui,
        parsed_options=SimpleNamespace(web_base_path=None),
        events=SimpleNamespace(test_start=FakeEvent()),
    )
    web_tab.install(env, lifecycle)
    return app, web_ui.template_args


def run_folder(run_dir: Path, tally: Tally) -> SimpleNamespace:
    """What the tabs read of a recorder.RunFolder."""
    return SimpleNamespace(run_id=run_dir.name, run_dir=run_dir, tally=tally)


def test_stats_requests_carry_the_tabs_and_the_page_gets_their_tables(tmp_path):
    lifecycle = SimpleNamespace(folder=run_folder(tmp_path, hand_made_tally()), finishing=None, last_run_dir=None)
    app, args = fake_locust(lifecycle)
    assert [t["key"] for t in args["extended_tabs"]] == [
        "dsv4bench-verdicts",
        "dsv4bench-examples",
        "dsv4bench-servers",
    ]
    assert [t["key"] for t in args["extended_tables"]] == [t["key"] for t in args["extended_tabs"]]
    assert args["extended_csv_files"][0]["href"] == "/dsv4bench/report"
    for _ in range(2):  # the same Response again: extended afresh, not twice
        stats = app.test_client().get("/stats/requests").get_json()
        assert stats["stats"] == [{"name": "Aggregated"}]
        tabs = {t["key"]: t["data"] for t in stats["extended_stats"]}
        assert list(tabs) == ["dsv4bench-verdicts", "dsv4bench-examples", "dsv4bench-servers"]
        assert {r["code"]: r["count"] for r in tabs["dsv4bench-verdicts"]}["dsml_leak_content"] == 2


def test_a_failing_tab_leaves_locusts_statistics_alone(tmp_path, caplog):
    lifecycle = SimpleNamespace(folder=run_folder(tmp_path, tally=None), finishing=None, last_run_dir=None)
    app, _ = fake_locust(lifecycle)
    response = app.test_client().get("/stats/requests")
    assert response.status_code == 200
    assert response.get_json() == {"stats": [{"name": "Aggregated"}], "errors": [], "state": "running"}
    assert "the web UI tabs could not be built" in caplog.text


REPORT_MD = f"""# dsv4bench report: run-1

**CORRUPT**: a detail {SCRIPT} and <img src=x onerror=alert(1)>

| code | turns |
|---|---|
| `dsml_leak_content` | 2 |

![timeline](plots/timeline.png)

[a link](javascript:alert(1))
"""


def test_the_report_page_renders_report_md_with_no_markup_of_its_own(tmp_path):
    run_dir = tmp_path / "run-1"
    (run_dir / "plots").mkdir(parents=True)
    (run_dir / "report.md").write_text(REPORT_MD)
    png = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16
    (run_dir / "plots" / "timeline.png").write_bytes(png)
    (run_dir / "run.json").write_text("{}")
    (tmp_path / "secret.txt").write_text("secret")
    (run_dir / "plots" / "outside.png").symlink_to(tmp_path / "secret.txt")
    lifecycle = SimpleNamespace(folder=None, finishing=None, last_run_dir=None)
    client = fake_locust(lifecycle)[0].test_client()

    assert "No test has finished yet." in client.get("/dsv4bench/report").get_data(as_text=True)
    assert client.get("/dsv4bench/plots/timeline.png").status_code == 404

    lifecycle.last_run_dir = run_dir
    page = client.get("/dsv4bench/report")
    text = page.get_data(as_text=True)
    assert page.status_code == 200 and page.mimetype == "text/html"
    assert "script-src" not in page.headers["Content-Security-Policy"]  # default-src 'none': no script
    assert "<script" not in text and "<img src=x" not in text and 'href="javascript:' not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "<table>" in text and '<img src="plots/timeline.png" alt="timeline">' in text
    with client.get("/dsv4bench/plots/timeline.png") as plot:
        assert plot.data == png
    for path in (
        "/dsv4bench/plots/../run.json",
        "/dsv4bench/plots/%2e%2e/run.json",
        "/dsv4bench/plots/outside.png",
        "/dsv4bench/plots/%2Fetc%2Fpasswd",
        "/dsv4bench/plots/nothing.png",
    ):
        with client.get(path, follow_redirects=True) as refused:
            assert refused.status_code == 404, path


def test_the_report_page_says_when_a_test_runs_or_its_report_is_being_built(tmp_path):
    run_dir = tmp_path / "run-2"
    run_dir.mkdir()
    lifecycle = SimpleNamespace(folder=run_folder(run_dir, Tally()), finishing=None, last_run_dir=None)
    client = fake_locust(lifecycle)[0].test_client()
    text = client.get("/dsv4bench/report").get_data(as_text=True)
    assert "Test run-2 is running" in text and "No test has finished yet." in text and "refresh" not in text

    lifecycle.folder, lifecycle.finishing = None, SimpleNamespace(dead=False)  # stopped: drain, checks, report
    text = client.get("/dsv4bench/report").get_data(as_text=True)
    assert "Test run-2 has stopped" in text and 'http-equiv="refresh"' in text


# ---- the web UI in a browser ----------------------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
VERDICT_COLUMNS = [title for _, title in web_tab.VERDICTS.columns]
EXAMPLE_COLUMNS = [title for _, title in web_tab.EXAMPLES.columns]
SERVER_COLUMNS = [title for _, title in web_tab.SERVERS.columns]


def table_js(columns: list[str]) -> str:
    """An expression for the rows of the page's table with these column titles (null when it
    has none): each cell's text, and how many elements it holds (none: text only)."""
    return f"""(() => {{
        const head = {json.dumps(columns)}.join('|');
        const table = [...document.querySelectorAll('table')]
            .find(t => [...t.querySelectorAll('thead th')].map(c => c.textContent.trim()).join('|') === head);
        if (!table) return null;
        const rows = [...table.querySelectorAll('tbody tr')].map(r => [...r.children].map(c => (
            {{text: c.textContent, elements: c.querySelectorAll('*').length}})));
        return rows.length ? rows : null;
    }})()"""


class Page:
    """One Chromium tab over the DevTools protocol: JSON commands on a websocket."""

    def __init__(self, ws_url: str) -> None:
        import simple_websocket

        self.ws = simple_websocket.Client.connect(ws_url, receive_bytes=1 << 16)
        self.ids = itertools.count(1)

    def call(self, method: str, timeout: float = 30.0, **params: Any) -> dict[str, Any]:
        n = next(self.ids)
        self.ws.send(json.dumps({"id": n, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            message = self.ws.receive(timeout=left)
            if message is None:
                break
            reply = json.loads(message)
            if reply.get("id") == n:
                assert "error" not in reply, (method, reply["error"])
                return reply["result"]
        raise TimeoutError(f"{method}: no answer in {timeout} s")

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def wait_for(self, expression: str, what: str, timeout: float = 20.0) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if value := self.evaluate(expression):
                return value
            time.sleep(0.25)
        raise AssertionError(f"the page never showed {what}")

    def open(self, url: str, ready: str, what: str) -> None:
        self.call("Page.navigate", url=url)
        self.wait_for(f"document.readyState === 'complete' && !!({ready})", what)

    def fill(self, name: str, text: str) -> None:
        """Type `text` over the input's value, as a person would (React sees the input events)."""
        assert self.evaluate(
            f"(() => {{ const e = document.querySelector('input[name={json.dumps(name)}]'); "
            "if (!e) return false; e.focus(); e.select(); return true; })()"
        ), name
        self.call("Input.insertText", text=text)

    def click_text(self, selector: str, text: str) -> None:
        assert self.evaluate(
            f"(() => {{ const e = [...document.querySelectorAll({json.dumps(selector)})]"
            f".find(e => e.textContent.trim() === {json.dumps(text)}); if (e) e.click(); return !!e; }})()"
        ), text

    def table(self, columns: list[str]) -> list[list[dict[str, Any]]] | None:
        return self.evaluate(table_js(columns))

    def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))
        print(f"screenshot: {path}")

    def close(self) -> None:
        self.ws.close()


@contextmanager
def chromium(tmp_path: Path) -> Iterator[Page]:
    """Headless Chromium on loopback, its DevTools port chosen by itself and read from its profile."""
    profile = tmp_path / "chromium-profile"
    log = open(tmp_path / "chromium.log", "w")
    proc = subprocess.Popen(
        [
            CHROMIUM,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            "--window-size=1400,1000",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    page = None
    try:
        active = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 20
        while not (active.exists() and active.read_text().strip()) and time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "chromium.log").read_text()[-2000:]
            time.sleep(0.1)
        port = int(active.read_text().split()[0])
        targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=5, trust_env=False).json()
        page = Page(next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page"))
        yield page
    finally:
        if page is not None:
            page.close()
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()


def history_counts(run_dir: Path) -> Counter[str]:
    """The verdicts tab's counts from the run folder's turns.jsonl, counted as the report counts."""
    turns = read_history(run_dir).turns
    counts = Counter(code for t in turns for code in turn_codes(t))
    counts.update(
        {
            "(turns)": len(turns),
            "(ok)": sum(t.status is TurnStatus.OK for t in turns),
            "(killed)": sum(t.status is TurnStatus.KILLED for t in turns),
            "(tool calls)": sum(tool_call_count(t) for t in turns),
        }
    )
    return counts


def page_counts(rows: list[list[dict[str, Any]]]) -> Counter[str]:
    code, count = VERDICT_COLUMNS.index("Code"), VERDICT_COLUMNS.index("Count")
    return Counter({r[code]["text"]: int(r[count]["text"]) for r in rows if r[count]["text"].strip()})


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed (Debian: apt-get install chromium)")
@pytest.mark.skipif(importlib.util.find_spec("locust") is None, reason="Locust is not installed (the locust extra)")
def test_the_verdicts_tab_in_a_browser_matches_the_run_history(tmp_path):
    replay = start_replay(tmp_path, fault_rate=40, stall=3.0)
    port, out = free_port(), tmp_path / "runs"
    log_path = tmp_path / "locust.log"
    log = open(log_path, "w")
    locust = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dsv4bench",
            "locust",
            "--host",
            replay.url,
            "--web-port",
            str(port),
            "--max-turns",
            "4",
            "--ttft-timeout",
            "1.5",
            "--total-timeout",
            "20",
            "--out",
            str(out),
            "--quiet",
        ],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=dict(os.environ),
    )
    base = f"http://127.0.0.1:{port}"

    def locust_log() -> str:
        return log_path.read_text()[-4000:]

    try:
        deadline = time.monotonic() + 30
        while True:
            assert locust.poll() is None, locust_log()
            assert time.monotonic() < deadline, f"Locust's web UI never answered\n{locust_log()}"
            try:
                if httpx.get(f"{base}/", timeout=1, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        with chromium(tmp_path) as page:
            page.open(f"{base}/", "document.querySelector('input[name=\"userCount\"]')", "the start form")
            page.fill("userCount", "4")
            page.fill("spawnRate", "4")
            page.click_text("button[type=submit]", "Start")
            page.wait_for(
                "[...document.querySelectorAll('[role=tab]')]"
                ".some(t => t.textContent.trim() === 'dsv4bench: verdicts')",
                "the dsv4bench tabs",
            )
            page.click_text("[role=tab]", "dsv4bench: verdicts")

            # While the test runs: every count the page shows is one the history already holds.
            deadline = time.monotonic() + 30
            while True:
                running = page_counts(page.table(VERDICT_COLUMNS) or [])
                if running["(turns)"] >= 12 and len(running) > 4:  # a code besides the four totals
                    break
                assert time.monotonic() < deadline, f"no code shown after 30 s: {running}\n{locust_log()}"
                time.sleep(0.5)
            (run_dir,) = out.iterdir()
            recorded = history_counts(run_dir)
            assert all(n <= recorded[k] for k, n in running.items()), (running, recorded)
            page.screenshot(tmp_path / "verdicts-running.png")

            page.click_text("button", "Stop")
            page.wait_for(
                "[...document.querySelectorAll('button')].some(b => b.textContent.trim() === 'New')", "the test stopped"
            )
            deadline = time.monotonic() + 30
            while not (run_dir / "report.md").exists():
                assert time.monotonic() < deadline, f"no report.md 30 s after the stop\n{locust_log()}"
                time.sleep(0.25)

            # After the stop, on a fresh load: the page's counts are exactly the history's.
            page.open(f"{base}/?tab={web_tab.VERDICTS.key}", "document.querySelector('table')", "the verdicts tab")
            rows = page.wait_for(table_js(VERDICT_COLUMNS), "the verdicts table")
            recorded = history_counts(run_dir)
            assert page_counts(rows) == recorded
            assert all(r[VERDICT_COLUMNS.index("Family")]["text"] for r in rows)
            assert any("finished" in r[VERDICT_COLUMNS.index("Meaning")]["text"] for r in rows)
            page.screenshot(tmp_path / "verdicts-stopped.png")

            page.click_text("[role=tab]", "dsv4bench: examples")
            examples = page.wait_for(table_js(EXAMPLE_COLUMNS), "the examples table")
            turns = {(t.session, t.turn): turn_codes(t) for t in read_history(run_dir).turns}
            c, s, n = (EXAMPLE_COLUMNS.index(k) for k in ("Code", "Session", "Turn"))
            assert examples and all(r[c]["text"] in turns.get((r[s]["text"], int(r[n]["text"])), []) for r in examples)
            page.click_text("[role=tab]", "dsv4bench: servers")
            servers = page.wait_for(table_js(SERVER_COLUMNS), "the servers table")
            assert "no --metrics endpoint" in servers[0][SERVER_COLUMNS.index("Wedge verdict")]["text"]
            # Server text is text in every cell: no element in any of them.
            assert all(cell["elements"] == 0 for table in (rows, examples, servers) for r in table for cell in r)

            page.click_text("[role=tab]", "Download Data")
            page.wait_for("!!document.querySelector('a[href=\"/dsv4bench/report\"]')", "the report's link")
            page.open(f"{base}/dsv4bench/report", "document.querySelector('h1')", "the report page")
            assert run_dir.name in page.evaluate("document.querySelector('h1').textContent")
            assert page.wait_for(
                "[...document.images].length > 0 && [...document.images].every(i => i.complete && i.naturalWidth > 0)",
                "the report's plots",
            )
            page.screenshot(tmp_path / "report.png")
    finally:
        if locust.poll() is None:
            locust.send_signal(signal.SIGTERM)
            try:
                locust.wait(30)
            except subprocess.TimeoutExpired:
                locust.kill()
                locust.wait(5)
        log.close()
        replay.stop()
