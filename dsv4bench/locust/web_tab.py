"""The dsv4bench tabs of Locust's web UI, and the run's report as a page.

Locust's extended tabs hold one table each, so there are three; their keys are stable (the
page keeps the open tab in its address, `/?tab=KEY`):

- `dsv4bench-verdicts`, "dsv4bench: verdicts": the test and where its report is, what the
  operator must know (`(notice)`: the test runs against a host the start form named, without
  the API key; `(web UI)`: requests from other sites refused, form fields ignored), the totals
  (turns, ok, killed, tool calls), then one row per verdict code seen, counted as the report
  counts them (recorder.Tally): family, meaning, turns with it, rate per turn and, for the
  corruption and oracle codes, per tool call;
- `dsv4bench-examples`, "dsv4bench: examples": the latest turns of each code (session, turn,
  what broke);
- `dsv4bench-servers`, "dsv4bench: servers": each scraped endpoint's queue gauges now
  (watch.json) and, once the test has stopped and the watch has judged, its drain, canary,
  /health and wedge verdict (the findings of watch.json, else of run.json).

They show the test running now, else the last one this process ran. Locust's page fetches them
with its statistics (`/stats/requests`, every 2 s, only while a test runs): the servers'
verdict, judged after the stop, shows on the next load of the page.

Routes, under --web-base-path:

- `/dsv4bench/report`: the last finished test's report.md as HTML (it reloads itself while a
  stopped test's report is being built); linked from the Download Data tab and named in the
  verdicts tab, since a cell of Locust's tables cannot be a link;
- `/dsv4bench/plots/<name>`: that run folder's plots, which report.md links as `plots/NAME.png`.

Server text (verdict details, scrape and canary errors, wedge details) goes to the tabs as
plain JSON strings, its control and bidi characters made visible (report.escape): Locust's page
puts every cell into the DOM as a text node (its table cell renders the value as a React child,
never as markup), so nothing a server writes is parsed as HTML there, and entity-escaping it
here would show `&lt;` to the reader. The report page is HTML made here: markdown-it with raw
HTML off, every other text escaped, under a Content-Security-Policy that runs no script.
"""

from __future__ import annotations

import html
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flask import Blueprint, Response, abort, request, send_file
from markdown_it import MarkdownIt

from dsv4bench.history.run_folder import REPORT_FILE, RUN_FILE
from dsv4bench.report.escape import escape_text
from dsv4bench.report.blocks import fmt_rate, fmt_seconds
from dsv4bench.report.plots import PLOTS_DIR
from dsv4bench.report.slo import SloTally
from dsv4bench.report.summary import wedge_findings
from dsv4bench.locust.recorder import RunFolder, Tally
from dsv4bench.locust.server_watch import read_watch_state

if TYPE_CHECKING:
    from dsv4bench.locust.lifecycle import Lifecycle
    from dsv4bench.locust.web_guard import Guard

log = logging.getLogger("dsv4bench.locust")

STATS_ENDPOINT = "locust.request_stats"  # Locust's /stats/requests view, which the page polls
EXTENDED_STATS = "extended_stats"
ROUTE_PREFIX = "/dsv4bench"
REPORT_PATH = f"{ROUTE_PREFIX}/report"
TEXT_LIMIT = 300  # characters of one server text in a cell; the run folder has all of it
# What the report page may load: its plots and its own inline style; no script, no frame.
REPORT_CSP = "default-src 'none'; img-src 'self'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
RELOAD_S = 5  # how often the report page reloads while a stopped test's report is being built
TOTAL, TEST = "total", "test"  # the family column of the verdicts tab's rows that are no code


@dataclass(frozen=True)
class Table:
    """One extended tab and its table: Locust's `extended_tabs` and `extended_tables` entries."""

    key: str
    title: str
    columns: tuple[tuple[str, str], ...]  # (row key, column title)


VERDICTS = Table(
    "dsv4bench-verdicts",
    "dsv4bench: verdicts",
    (
        ("code", "Code"),
        ("family", "Family"),
        ("meaning", "Meaning"),
        ("count", "Count"),
        ("per_turn", "Per turn"),
        ("per_tool_call", "Per tool call"),
    ),
)
EXAMPLES = Table(
    "dsv4bench-examples",
    "dsv4bench: examples",
    (("code", "Code"), ("session", "Session"), ("turn", "Turn"), ("what", "What broke")),
)
SERVERS = Table(
    "dsv4bench-servers",
    "dsv4bench: servers",
    (
        ("endpoint", "Endpoint"),
        ("phase", "Watch phase"),
        ("scrape", "Last scrape"),
        ("queues", "Queues now"),
        ("drain", "Drain"),
        ("canary", "Canary"),
        ("health", "/health"),
        ("verdict", "Wedge verdict"),
    ),
)
TABLES = (VERDICTS, EXAMPLES, SERVERS)


def template_args(base_path: str = "") -> dict[str, Any]:
    """What the page needs to draw the tabs and the report's link (Locust's template_args)."""
    return {
        "extended_tabs": [{"title": t.title, "key": t.key} for t in TABLES],
        "extended_tables": [
            {"key": t.key, "structure": [{"key": k, "title": title} for k, title in t.columns]} for t in TABLES
        ],
        "extended_csv_files": [
            {"href": f"{base_path}{REPORT_PATH}", "title": "dsv4bench: the report of the last finished test (HTML)"}
        ],
    }


def server_text(value: Any) -> str:
    """A server's text made safe to show: visible escapes for what would hide or reorder text,
    and cut at TEXT_LIMIT."""
    text = escape_text(str(value))
    return text if len(text) <= TEXT_LIMIT else text[: TEXT_LIMIT - 1] + "…"


# ---- the verdicts and examples tabs -------------------------------------------------------------


@dataclass(frozen=True)
class ShownTest:
    """Which test the tabs show and how far it is."""

    run_id: str
    run_dir: Path
    state: str  # running, stopped (drain, checks, report), finished, ...


def verdict_rows(
    tally: Tally, test: ShownTest | None, report_url: str, notices: Sequence[str] = (), warnings: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """The verdicts tab: the test, its report, what the operator must know of the test
    (`notices`: a host changed in the start form) and of the web UI (`warnings`: refused
    requests, ignored form fields), the totals, then one row per code seen."""
    said = [
        {"code": code, "family": TEST, "meaning": escape_text(text), "count": None, "per_turn": "", "per_tool_call": ""}
        for code, texts in (("(notice)", notices), ("(web UI)", warnings))
        for text in texts
    ]
    if test is None:
        return [
            {
                "code": "(test)",
                "family": TEST,
                "meaning": "no test has started yet",
                "count": None,
                "per_turn": "",
                "per_tool_call": "",
            },
            *said,
        ]

    def row(
        code: str,
        family: str,
        meaning: str,
        count: int | None,
        per_turn: float | None = None,
        per_tool_call: float | None = None,
    ) -> dict[str, Any]:
        return {
            "code": code,
            "family": family,
            "meaning": meaning,
            "count": count,
            "per_turn": fmt_rate(per_turn) if per_turn is not None else "",
            "per_tool_call": fmt_rate(per_tool_call) if per_tool_call is not None else "",
        }

    rows = [
        row("(test)", TEST, f"{test.run_id}: {test.state}; its run folder is {test.run_dir}", None),
        row(
            "(report)",
            TEST,
            f"the last finished test's report.md as a page: {report_url} (also in the Download Data tab)",
            None,
        ),
        *said,
        row("(turns)", TOTAL, "turns recorded", tally.turns),
        row("(ok)", TOTAL, "turns that completed", tally.ok, tally.ok / tally.turns if tally.turns else None),
        row(
            "(killed)",
            TOTAL,
            "turns cut short by stopping their user: judged by nothing",
            tally.killed,
            tally.killed / tally.turns if tally.turns else None,
        ),
        row("(tool calls)", TOTAL, "tool calls of the completed turns", tally.tool_calls),
        *slo_rows(tally.slo, row),
    ]
    for r in tally.rows():
        rows.append(row(r["code"], r["family"], r["meaning"], r["turns"], r["per_turn"], r["per_tool_call"]))
    return rows


def slo_rows(slo: SloTally | None, row: Callable[..., dict[str, Any]]) -> list[dict[str, Any]]:
    """With --slo: the turns meeting every target (counted as report/slo.py counts them) and the
    goodput, over the recorded turns' own span (the first one's start to the last one's end)."""
    if slo is None:
        return []
    window = slo.turns_window_s
    figures = slo.figures(window)
    rate = figures["goodput_turns_per_s"]
    tokens = figures["goodput_tokens_per_s"]
    goodput = (
        f"goodput {rate:.2f} turns/s, {tokens:.1f} output tokens/s over the turns' {fmt_seconds(window)}"
        if rate is not None and tokens is not None
        else "goodput: no turn yet"
    )
    return [
        row(
            "(slo)",
            TOTAL,
            f"turns meeting every --slo target ({slo.targets.spec}) of the {slo.counted} counted "
            f"(killed ones are not, corrupt or failed ones never meet them); {goodput}",
            slo.good,
            slo.share,
        )
    ]


def example_rows(tally: Tally) -> list[dict[str, Any]]:
    """The examples tab: the latest turns of each code, newest first, codes as the verdicts tab
    orders them."""
    out = []
    for r in tally.rows():
        for ex in reversed(tally.examples.get(r["code"], ())):
            out.append(
                {"code": r["code"], "session": str(ex["session"]), "turn": ex["turn"], "what": server_text(ex["what"])}
            )
    return out


# ---- the servers tab ----------------------------------------------------------------------------


def _queues(queues: Any) -> str:
    """`num_queue_reqs=12, num_running_reqs=3` by bare name, `all 0`, or `–` for none."""
    if not isinstance(queues, dict) or not queues:
        return "–"
    bare = [(str(k).split("{", 1)[0].split(":", 1)[-1], v) for k, v in queues.items()]
    nonzero = [f"{name}={v:g}" if isinstance(v, (int, float)) else f"{name}={v}" for name, v in bare if v]
    return server_text(", ".join(nonzero)) if nonzero else "all 0"


def _scrape(now: dict[str, Any] | None) -> str:
    if now is None:
        return ""  # a /health or canary URL: judged after the stop, never scraped
    return "ok" if now.get("ok") else f"failed: {server_text(now.get('error') or 'no detail')}"


def _drain(found: dict[str, Any] | None) -> str:
    if found is None:
        return ""
    drain = found.get("drain_s")
    if isinstance(drain, (int, float)):
        return f"drained in {fmt_seconds(drain)}"
    return "did not drain" if found.get("gauges") else "–"


def _canary(found: dict[str, Any] | None) -> str:
    if found is None:
        return ""
    c = found.get("canary")
    if isinstance(c, dict):
        latency = c.get("latency_s")
        took = f" in {fmt_seconds(latency)}" if isinstance(latency, (int, float)) else ""
        if c.get("ok"):
            return f"ok{took}"
        if c.get("result") == "timeout":
            return f"hung{took}"
        return f"{server_text(c.get('result') or 'failed')}: {server_text(c.get('error') or 'no detail')}"
    return "hung" if "canary_timeout" in found["codes"] else "–"


def _health(found: dict[str, Any] | None) -> str:
    if found is None:
        return ""
    return "lied: 200 while requests hung" if "health_lies" in found["codes"] else "no lie found"


def _verdict(found: dict[str, Any] | None, pending: bool) -> str:
    if found is None:
        return "judged after the drain and checks" if pending else ""
    codes = ", ".join(server_text(c) for c in found["codes"]) or "healthy"
    details = [server_text(d) for d in found.get("details") or []]
    return f"{codes}: {'; '.join(details)}" if details else codes


def server_rows(
    watch_state: dict[str, Any] | None, findings: dict[str, dict[str, Any]], test: ShownTest | None
) -> list[dict[str, Any]]:
    """The servers tab: every endpoint the watch scrapes, then every other endpoint judged
    (/health and canary URLs). `findings` are wedge_findings' normalised ones ({} before)."""
    watch_state = watch_state if isinstance(watch_state, dict) else {}
    endpoints = v if isinstance(v := watch_state.get("endpoints"), dict) else {}
    phase = str(watch_state.get("phase") or ("done" if findings else ""))
    if not endpoints and not findings:
        why = (
            "no test has started yet"
            if test is None
            else "no server is scraped in this test: no --metrics endpoint was given or found"
        )
        return [
            {
                "endpoint": "–",
                "phase": phase,
                "scrape": "",
                "queues": "",
                "drain": "",
                "canary": "",
                "health": "",
                "verdict": why,
            }
        ]
    pending = phase in ("load", "drain", "checks")
    rows = []
    for endpoint in [*endpoints, *(e for e in findings if e not in endpoints)]:
        now = endpoints.get(endpoint)
        now = now if isinstance(now, dict) else None
        found = findings.get(endpoint)
        rows.append(
            {
                "endpoint": server_text(endpoint),
                "phase": phase,
                "scrape": _scrape(now),
                "queues": _queues(now.get("queues")) if now is not None else "",
                "drain": _drain(found),
                "canary": _canary(found),
                "health": _health(found),
                "verdict": _verdict(found, pending),
            }
        )
    return rows


def findings_of(run_dir: Path, watch_state: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """The wedge findings of a test: the watch's once it has judged, else run.json's (a test
    whose watch did not write them), else none yet."""
    if isinstance(watch_state, dict) and isinstance(watch_state.get("wedge"), dict):
        return wedge_findings({"wedge": watch_state["wedge"]})
    if isinstance(watch_state, dict) and watch_state.get("phase") != "done":
        return {}  # the watch has not judged yet; run.json has no findings before it does
    try:
        run = json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return wedge_findings(run) if isinstance(run, dict) else {}


# ---- the report page ----------------------------------------------------------------------------


_MARKDOWN = MarkdownIt("js-default", {"html": False})  # raw HTML in report.md is shown as text

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">{reload}
<title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 72rem; margin: 1rem auto; padding: 0 1rem; line-height: 1.4; }}
table {{ border-collapse: collapse; margin: 0.5rem 0; }}
th, td {{ border: 1px solid #bbb; padding: 0.2rem 0.5rem; text-align: left; vertical-align: top; }}
code, pre {{ background: #f4f4f4; }}
pre {{ padding: 0.5rem; overflow-x: auto; }}
img {{ max-width: 100%; }}
.note {{ background: #fff6d5; border: 1px solid #e0c060; padding: 0.5rem; }}
</style></head>
<body>
{notes}
{body}
</body></html>
"""


def report_page(title: str, notes: list[str], body_html: str, reload: bool) -> str:
    """The page around a rendered report: `title` and `notes` are text (escaped here),
    `body_html` is markdown-it's output."""
    return _PAGE.format(
        reload=f'\n<meta http-equiv="refresh" content="{RELOAD_S}">' if reload else "",
        title=html.escape(title),
        notes="\n".join(f'<p class="note">{html.escape(n)}</p>' for n in notes),
        body=body_html,
    )


def render_markdown(text: str) -> str:
    return _MARKDOWN.render(text)


# ---- what ties them to the running Locust -------------------------------------------------------


class Tabs:
    """The tabs' view of this process's tests: the one running now (lifecycle.folder), else the
    last one seen, whose tally stays in memory after its stop."""

    def __init__(self, lifecycle: Lifecycle, base_path: str = "", guard: Guard | None = None) -> None:
        self.lifecycle = lifecycle
        self.guard = guard
        self.report_url = f"{base_path}{REPORT_PATH}"
        self.folder: RunFolder | None = None
        self._last_failure: str | None = None

    def test_start(self, **_: Any) -> None:
        """Locust's test_start, after the lifecycle's: a test shorter than one poll is seen too."""
        self.current()

    def current(self) -> RunFolder | None:
        if self.lifecycle.folder is not None:
            self.folder = self.lifecycle.folder
        return self.folder

    def notices(self, run_dir: Path | None) -> list[str]:
        """What the lifecycle has to say of that test (lifecycle.notices)."""
        notices = getattr(self.lifecycle, "notices", None) or {}
        return list(notices.get(run_dir, ())) if run_dir is not None else []

    def warnings(self) -> list[str]:
        return list(self.guard.warnings) if self.guard is not None else []

    def _finishing(self) -> bool:
        finishing = self.lifecycle.finishing
        return finishing is not None and not finishing.dead

    def view(self, folder: RunFolder) -> ShownTest:
        if folder is self.lifecycle.folder:
            state = "running"
        elif (folder.run_dir / REPORT_FILE).exists():
            state = "finished"
        elif self._finishing():
            state = "stopped; the servers' drain and checks, then the report"
        else:
            state = f"stopped with no report (`dsv4bench report {folder.run_dir}` builds it)"
        return ShownTest(folder.run_id, folder.run_dir, state)

    def extended_stats(self) -> list[dict[str, Any]]:
        """Locust's `extended_stats`: the rows of every tab."""
        folder = self.current()
        test = self.view(folder) if folder is not None else None
        tally = folder.tally if folder is not None else Tally()
        watch_state = read_watch_state(folder.run_dir) if folder is not None else None
        findings = findings_of(folder.run_dir, watch_state) if folder is not None else {}
        return [
            {
                "key": VERDICTS.key,
                "data": verdict_rows(
                    tally, test, self.report_url, self.notices(folder.run_dir if folder else None), self.warnings()
                ),
            },
            {"key": EXAMPLES.key, "data": example_rows(tally)},
            {"key": SERVERS.key, "data": server_rows(watch_state, findings, test)},
        ]

    def with_tabs(self, response: Response) -> Response:
        """Flask's after_request: the tabs' rows into Locust's /stats/requests. Any failure here
        serves Locust's statistics as they are, and is logged (once while it repeats)."""
        if request.endpoint != STATS_ENDPOINT or response.status_code != 200 or not response.is_json:
            return response
        try:
            stats = json.loads(response.get_data())
        except ValueError:
            return response
        if not isinstance(stats, dict):
            return response
        # NOTE: Locust memoizes this view's Response object, so one already extended can come back.
        stats.pop(EXTENDED_STATS, None)
        try:
            body = json.dumps({**stats, EXTENDED_STATS: self.extended_stats()}, allow_nan=False)
            self._last_failure = None
        except Exception as e:  # the tabs must never cost Locust its statistics
            failure = f"{type(e).__name__}: {e}"
            if failure != self._last_failure:
                log.exception("dsv4bench: the web UI tabs could not be built; serving Locust's statistics alone")
            self._last_failure = failure
            body = json.dumps(stats)
        response.set_data(body)
        return response

    # ---- the routes -------------------------------------------------------------------------------

    def report_response(self) -> Response:
        """The last finished test's report.md as HTML, with a note on a test that runs or stops."""
        notes = []
        seen = self.current()
        run_dir = self.lifecycle.last_run_dir
        building = False
        if seen is not None and seen is self.lifecycle.folder:
            notes.append(f"Test {seen.run_id} is running; its report is written when it stops.")
            notes.extend(self.notices(seen.run_dir))
        elif seen is not None and not (seen.run_dir / REPORT_FILE).exists() and self._finishing():
            building = True
            notes.append(
                f"Test {seen.run_id} has stopped: the servers' drain and checks run, then its report is "
                f"built. This page reloads itself every {RELOAD_S} s."
            )
        if run_dir is None:
            return self._page("dsv4bench report", notes + ["No test has finished yet."], "", building)
        try:
            text = (run_dir / REPORT_FILE).read_text(encoding="utf-8", errors="replace")
        except OSError:
            if not building:
                notes.append(f"{run_dir} has no {REPORT_FILE}: `dsv4bench report {run_dir}` builds it.")
            return self._page(f"dsv4bench report: {run_dir.name}", notes, "", building)
        if seen is not None and seen.run_dir != run_dir:
            notes.append(f"This is the report of {run_dir.name}, the last finished test.")
        notes.append(f"Run folder: {run_dir}")
        notes.extend(self.notices(run_dir))
        return self._page(f"dsv4bench report: {run_dir.name}", notes, render_markdown(text), building)

    @staticmethod
    def _page(title: str, notes: list[str], body_html: str, reload: bool) -> Response:
        response = Response(report_page(title, notes, body_html, reload), mimetype="text/html")
        response.headers["Content-Security-Policy"] = REPORT_CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Cache-Control"] = "no-store"  # the next test's report is at the same address
        return response

    def plot_response(self, name: str) -> Response:
        """A file of the last finished test's plots folder; 404 for anything outside it."""
        run_dir = self.lifecycle.last_run_dir
        if run_dir is None:
            abort(404)
        plots = (run_dir / PLOTS_DIR).resolve()
        path = (plots / name).resolve()
        if not path.is_relative_to(plots) or not path.is_file():
            abort(404)
        response = send_file(path, max_age=0)
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response


def install(environment: Any, lifecycle: Lifecycle, guard: Guard | None = None) -> None:
    """The tabs, their rows in /stats/requests and the report's routes, on Locust's web UI
    (called from the locustfile's init, before the web UI serves)."""
    web_ui = environment.web_ui
    base_path = (getattr(environment.parsed_options, "web_base_path", None) or "").rstrip("/")
    tabs = Tabs(lifecycle, base_path, guard)
    environment.events.test_start.add_listener(tabs.test_start)
    web_ui.template_args.update(template_args(base_path))
    routes = Blueprint("dsv4bench", __name__, url_prefix=f"{base_path}{ROUTE_PREFIX}")
    routes.add_url_rule("/report", "report", web_ui.auth_required_if_enabled(tabs.report_response))
    routes.add_url_rule("/plots/<path:name>", "plots", web_ui.auth_required_if_enabled(tabs.plot_response))
    web_ui.app.register_blueprint(routes)
    web_ui.app.after_request(tabs.with_tabs)
