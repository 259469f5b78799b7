"""`python -m dsv4bench.locust.server_watch RUN_DIR`: the servers' side of one Locust test, in a
process of its own, since Locust runs on gevent and the anyio watch never shares a process
with it. The process that owns the run folder starts it at the test's start and writes one line
to its stdin when the load stops (an end of input means the same: the owner died).

Until then it does what `agents` does during its load (harness.server_watch.ServerWatch): scrapes every
--metrics endpoint into metrics.jsonl and polls each server's /health. Then the drain window,
the final checks (each server by its role, a canary), and the wedge verdict into run.json, as
`agents` writes it. All along it keeps `watch.json` in the folder, what the web UI's tab shows
of the servers: each endpoint's latest queue gauges, the phase, and at the end the findings.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio

from dsv4bench.servers.dialect import is_queue_gauge
from dsv4bench.servers.discovery import Deployment
from dsv4bench.harness.driver import make_client
from dsv4bench.history.run_folder import RUN_FILE, HistoryWriter, write_json_atomic
from dsv4bench.harness.server_watch import ServerWatch
from dsv4bench.harness.run import judge_wedge
from dsv4bench.locust.plan import Plan

WATCH_FILE = "watch.json"


def read_watch_state(run_dir: Path) -> dict[str, Any] | None:
    """What the watch last wrote of the servers, or None (no watch, or not yet)."""
    try:
        return json.loads((run_dir / WATCH_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


class _State:
    def __init__(self, run_dir: Path, watch: ServerWatch) -> None:
        self.run_dir, self.watch, self.phase = run_dir, watch, "load"
        self.wedge: dict[str, Any] | None = None

    def write(self) -> None:
        endpoints = {
            ep: {
                "ok": s.ok,
                "error": s.error,
                "queues": {k: v for k, v in (s.values or {}).items() if is_queue_gauge(k)},
            }
            for ep, s in self.watch.latest().items()
        }
        write_json_atomic(self.run_dir / WATCH_FILE, {"phase": self.phase, "endpoints": endpoints, "wedge": self.wedge})


async def watch_servers(run_dir: Path) -> None:
    run_info = json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))
    plan = Plan.from_run_info(run_info)
    config = plan.config
    history = HistoryWriter(run_dir, None, config.redactor)
    watch = ServerWatch(config, plan.model, history)
    deployment = Deployment.from_dict(plan.facts.get("deployment"))
    if deployment is not None:
        watch.know_roles(deployment.roles())
    state = _State(run_dir, watch)

    async def keep_state() -> None:
        while True:
            state.write()
            await anyio.sleep(config.metrics_interval)

    try:
        async with make_client(config) as client, anyio.create_task_group() as tg:
            watch.start(tg, client)
            tg.start_soon(keep_state)
            await anyio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
            state.phase = "drain"
            await watch.drain()
            state.phase = "checks"
            await watch.final_checks(client)
            tg.cancel_scope.cancel()
        wedge = judge_wedge(config, watch, history)
        if wedge is not None:
            run_info["wedge"] = wedge
            history.update_run_info(run_info)
        state.wedge, state.phase = wedge, "done"
        state.write()
    finally:
        history.close()


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python -m dsv4bench.locust.server_watch RUN_DIR")
    anyio.run(watch_servers, Path(sys.argv[1]))


if __name__ == "__main__":
    main()
