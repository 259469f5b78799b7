"""One Locust test from its start to its report, in whichever Locust process this is:

- the process that owns the test's run folder (Locust's master, or the only process): makes
  the folder at the test's start, starts the server watch beside it (server_watch.py, with
  --metrics), writes what every user records, and at the stop tells the watch, waits for its
  drain and checks, ends the history and builds the report; at quitting, waits for that and
  sets the exit code from `--fail-on`, as `agents` does;
- a worker: plays its users under the master's plan and run id and sends every record to the
  master (recorder.py); a master whose worker stops answering ends that worker's open
  sessions `worker_lost`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import gevent
from gevent import subprocess as gsubprocess
from locust import stats as locust_stats
from locust.runners import MasterRunner, WorkerRunner

from dsv4bench.harness.config import ConfigError
from dsv4bench.report import build_report
from dsv4bench.report.escape import escape_text
from dsv4bench.history.events import RunEndReason
from dsv4bench.history.verdict import exit_code
from dsv4bench.locust.plan import API_KEY_ENV, PLAN_ARG, Plan
from dsv4bench.locust.recorder import EVENT_MESSAGE, TURN_MESSAGE, LocustRun, RunFolder, current_or_none, set_current
from dsv4bench.locust.shapes import KILL_ENV, SHAPE_ENV

log = logging.getLogger("dsv4bench.locust")

PLAN_OPTION = PLAN_ARG.removeprefix("--").replace("-", "_")  # its name in Locust's options
RUN_ID_OPTION = "dsv4bench_run"  # the master's run id, forwarded to its workers with every spawn
STRAGGLER_GRACE_S = 1.0  # for the last records from workers, when no watch's drain waits longer
MISSING_POLL_S = 1.0


class Lifecycle:
    """The listeners of one Locust process (installed by the locustfile)."""

    def __init__(self, environment: Any) -> None:
        self.env = environment
        self.folder: RunFolder | None = None
        # NOTE: the folder workers' records go to: kept past the stop until it is closed, since
        # the turns each worker's stopped users record, and its tally, arrive after it.
        self.receiving: RunFolder | None = None
        self.watcher: subprocess.Popen | None = None
        self.finishing: gevent.Greenlet | None = None
        self.watching_workers: gevent.Greenlet | None = None
        self.marking_kills: gevent.Greenlet | None = None
        self.lost: set[str] = set()
        self.last_summary: dict[str, Any] | None = None
        self.last_plan: Plan | None = None
        self.last_run_dir: Path | None = None  # the latest test whose history is complete
        # What the web UI tells of each test (a host changed in the start form), by run folder.
        self.notices: dict[Path, list[str]] = {}
        runner = environment.runner
        # NOTE: the plan as the command line gave it, read before the web UI serves: Locust's
        # start form can write any of its options, so each test starts from this one (the guard
        # drops such a field; this holds even if one got through). A worker has none of its own:
        # its master's comes with every spawn.
        self.command_line_plan: str | None = (
            None if isinstance(runner, WorkerRunner) else getattr(environment.parsed_options, PLAN_OPTION, None)
        )
        if isinstance(runner, MasterRunner):
            runner.register_message(TURN_MESSAGE, self._on_turn_message)
            runner.register_message(EVENT_MESSAGE, self._on_event_message)

    # ---- Locust's events --------------------------------------------------------------------------

    def test_start(self, **_: Any) -> None:
        if self.finishing is not None:
            self.finishing.join()  # the last test's report first: one folder at a time
        runner = self.env.runner
        try:
            if not isinstance(runner, WorkerRunner):
                self._keep_command_line_plan()
            plan = Plan.from_options(self.env.parsed_options)
            cli_host = plan.config.base_url
            plan, host_changed = with_ui_host(plan, self.env.host)
        except ConfigError as e:
            log.error("dsv4bench: %s; the test stops", e)
            if getattr(self.env.parsed_options, "headless", False):
                self.env.runner.quit()
            else:  # the web UI stays up for a corrected start
                gevent.spawn(self.env.runner.stop)
            return
        if isinstance(runner, WorkerRunner):
            run_id = getattr(self.env.parsed_options, RUN_ID_OPTION, "") or "unknown"
            set_current(
                LocustRun(
                    plan, run_id, max(runner.worker_index, 0), send=lambda kind, data: runner.send_message(kind, data)
                )
            )
            return
        folder = RunFolder.new(plan, self._locust_info())
        setattr(self.env.parsed_options, RUN_ID_OPTION, folder.run_id)
        self.folder = self.receiving = folder
        self.last_plan, self.lost = plan, set()
        set_current(LocustRun(plan, folder.run_id, 0, folder=folder))
        if host_changed:
            self._host_changed(folder, plan, cli_host)
        if plan.config.metrics:
            self.watcher = gsubprocess.Popen(
                [sys.executable, "-m", "dsv4bench.locust.server_watch", str(folder.run_dir)],
                stdin=subprocess.PIPE,
                env=_watch_env(plan),
            )
        if isinstance(runner, MasterRunner):
            self.watching_workers = gevent.spawn(self._watch_workers, folder)
        kills = getattr(getattr(self.env.shape_class, "plan", None), "kills", None)
        if kills is not None:
            self.marking_kills = gevent.spawn(self._mark_kills, folder, kills())
        log.warning("dsv4bench: test %s recording into %s", folder.run_id, folder.run_dir)

    def _keep_command_line_plan(self) -> None:
        options = self.env.parsed_options
        if self.command_line_plan is None or options is None:
            return
        if getattr(options, PLAN_OPTION, None) != self.command_line_plan:
            log.warning(
                "dsv4bench: the run's plan was changed after the start (%s); the command line's is kept", PLAN_ARG
            )
            setattr(options, PLAN_OPTION, self.command_line_plan)  # and so forwarded to the workers

    def _host_changed(self, folder: RunFolder, plan: Plan, cli_host: str) -> None:
        """The web UI's start form named another host than --host: said in the log, the history
        and the tab and report page."""
        had_key = bool(os.environ.get(API_KEY_ENV))
        notice = (
            f"This test runs against {escape_text(plan.config.base_url)}, which the web UI's start form named, "
            f"not the --host of the command line ({escape_text(cli_host)})"
        )
        notice += (
            ": the API key is not sent to it (no Authorization header), and the server watch runs without it."
            if had_key
            else "."
        )
        self.notices[folder.run_dir] = [notice]
        folder.history.event(
            "host_changed", host=plan.config.base_url, command_line_host=cli_host, key_sent=False, key_given=had_key
        )
        log.warning("dsv4bench: %s", notice)

    def test_stop(self, **_: Any) -> None:
        if isinstance(self.env.runner, WorkerRunner):
            if (run := current_or_none()) is not None:
                run.report_sent()
            return
        if self.folder is None:
            return
        folder, watcher, self.folder, self.watcher = self.folder, self.watcher, None, None
        if self.marking_kills is not None:  # a kill storm: its end stops every user at once
            self.marking_kills.kill(block=False)
            folder.history.event(
                "kill",
                spec=_kill_specs() or "kill-storm",
                users=self.env.shape_class.plan.users,
                sessions=[],
                reason="the storm's end",
            )
        if self.watching_workers is not None:
            self.watching_workers.kill(block=False)
        self.watching_workers = self.marking_kills = None
        # NOTE: not here: test_stop runs inside the web UI's /stop request; the drain takes seconds.
        self.finishing = gevent.spawn(self._finish, folder, watcher)

    def quitting(self, **_: Any) -> None:
        if self.folder is not None:  # quit while a test runs (Ctrl-C, SIGTERM): it stops first
            self.test_stop()
        if self.finishing is not None:
            self.finishing.join()
            if getattr(self.env.parsed_options, "csv_prefix", None):
                # NOTE: Locust rewrites its --csv files once a CSV_STATS_INTERVAL_SEC and does not
                # at exit: one more pass, so they count the turns its stopped users recorded last.
                gevent.sleep(locust_stats.CSV_STATS_INTERVAL_SEC + 0.2)
        if self.last_summary is not None and self.last_plan is not None:
            self.env.process_exit_code = exit_code(self.last_summary, self.last_plan.config.fail_on)

    # ---- the owner's work -------------------------------------------------------------------------

    def _finish(self, folder: RunFolder, watcher: subprocess.Popen | None) -> None:
        if watcher is not None:
            assert watcher.stdin is not None  # started with stdin=PIPE: its word to stop comes that way
            try:
                watcher.stdin.write(b"stop\n")
                watcher.stdin.close()
            except OSError:
                pass  # it died: its end of input is the same word
            watcher.wait()
        else:
            gevent.sleep(STRAGGLER_GRACE_S)
        if self.receiving is folder:
            self.receiving = None
        folder.close(RunEndReason.COMPLETE)
        self.last_run_dir = folder.run_dir
        try:
            self.last_summary = build_report(folder.run_dir)
        except Exception:  # the history stands; `dsv4bench report` can rebuild it
            log.exception("dsv4bench: the report of %s could not be built", folder.run_dir)
            return
        log.warning(
            "dsv4bench: %s: %s (%s)", folder.run_id, self.last_summary.get("verdict"), folder.run_dir / "report.md"
        )

    def _locust_info(self) -> dict[str, Any]:
        o = self.env.parsed_options
        shaped = self.env.shape_class is not None  # then the shape, not --users, says how many
        return {
            "mode": "master" if isinstance(self.env.runner, MasterRunner) else "local",
            "users": None if shaped else getattr(o, "num_users", None),
            "spawn_rate": None if shaped else getattr(o, "spawn_rate", None),
            "run_time": getattr(o, "run_time", None),
            "headless": getattr(o, "headless", None),
            "shape": os.environ.get(SHAPE_ENV) if self.env.shape_class is not None else None,
            "kill": _kill_specs().split(" ") if _kill_specs() else [],
        }

    # ---- the master -------------------------------------------------------------------------------

    def _on_turn_message(self, msg: Any, **_: Any) -> None:
        if self.receiving is not None and isinstance(msg.data, dict):
            self.receiving.turn(msg.data, worker=msg.node_id)

    def _on_event_message(self, msg: Any, **_: Any) -> None:
        data = msg.data
        if self.receiving is not None and isinstance(data, dict) and isinstance(data.get("kind"), str):
            fields = {k: v for k, v in data.items() if k != "kind"}
            self.receiving.event(data["kind"], worker=msg.node_id, **fields)

    @staticmethod
    def _mark_kills(folder: RunFolder, kills: list[tuple[float, int]]) -> None:
        """A kill storm's `kill` events, as the nemesis of `agents` writes them, at its schedule."""
        started = time.monotonic()
        for at, users in kills:
            gevent.sleep(max(0.0, started + at - time.monotonic()))
            folder.history.event("kill", spec=_kill_specs() or "kill-storm", at_s=at, users=users, sessions=[])

    def _watch_workers(self, folder: RunFolder) -> None:
        while True:
            for node in self.env.runner.clients.missing:
                if node.id not in self.lost:
                    self.lost.add(node.id)
                    folder.history.event("worker_lost", worker=node.id)
                    folder.worker_lost(node.id)
            gevent.sleep(MISSING_POLL_S)


def _kill_specs() -> str:
    """The kill storm's --kill specs, space-separated ("" without)."""
    return " ".join(k for k in os.environ.get(KILL_ENV, "").splitlines() if k.strip())


def with_ui_host(plan: Plan, ui_host: str | None) -> tuple[Plan, bool]:
    """The plan with the web UI's Host field as the users' target, and whether that differs from
    the command line's --host (the plan's url). The API key goes only to the --host the command
    line gave: a test against any other host runs without it."""
    host = (ui_host or "").rstrip("/")
    if not host or host == plan.config.base_url:
        return plan, False
    return dataclasses.replace(plan, config=dataclasses.replace(plan.config, url=host, api_key=None)), True


def _watch_env(plan: Plan) -> dict[str, str]:
    env = dict(os.environ)
    # NOTE: the watch reads the key from its environment (Plan.from_json): a test whose key was
    # withheld (with_ui_host) must not hand it over there, where the canary goes to the same host.
    env.pop(API_KEY_ENV, None)
    if plan.config.api_key:
        env[API_KEY_ENV] = plan.config.api_key
    return env
