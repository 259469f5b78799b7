"""The Grafana dashboard's PromQL against a real Prometheus scraping the bundled PD engine, the
harness exporter and a recorded SGLang page: every panel query (and every template variable)
must find series, and a queue gauge must count each request once."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from dsv4bench.engine.launcher import free_port, start_engine
from dsv4bench.harness.exporter import HarnessExporter
from dsv4bench.harness.progress import LiveStats
from tests.fixtures.metrics import page, serving

from .conftest import ROOT

DASHBOARD = ROOT / "dashboards" / "dsv4bench-sglang-pd.json"
PROMETHEUS = shutil.which("prometheus")
# Grafana's values for the dashboard's variables: "All" for each query variable, and a rate
# window that holds several 1 s scrapes of the traffic below.
VARIABLES = {"$__rate_interval": "30s", "$model_name": ".*", "$engine_type": ".*", "$run": ".*"}

pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus binary (apt-get install prometheus)")


def _grafana(expr: str) -> str:
    for var, value in VARIABLES.items():
        expr = expr.replace(var, value)
    assert "$" not in expr, f"a dashboard variable the test does not know: {expr}"
    return expr


@contextmanager
def _prometheus(tmp: Path, targets: list[str]) -> Iterator[str]:
    """Prometheus scraping `targets` (host:port) every second, on a free loopback port; its URL."""
    port = free_port()
    (tmp / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: dsv4bench\n    static_configs:\n"
        f"      - targets: [{', '.join(repr(t) for t in targets)}]\n"
    )
    with open(tmp / "prometheus.log", "w") as log:
        proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def _query(api: str, expr: str) -> list[dict]:
    r = httpx.get(f"{api}/api/v1/query", params={"query": expr}, timeout=10, trust_env=False)
    body = r.json()
    assert body.get("status") == "success", f"{expr}: {body}"
    return body["data"]["result"]


def _wait(what: str, ready, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if ready():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{what} within {timeout:.0f} s")


def _chat(api: str, i: int) -> None:
    body = {
        "model": "dsv4-mini",
        "messages": [{"role": "user", "content": f"Say {i}."}],
        "max_tokens": 8,
        "temperature": 0,
        "stream": i % 2 == 0,
    }
    r = httpx.post(f"{api}/chat/completions", json=body, timeout=60, trust_env=False)
    assert r.status_code == 200, r.text


def _exprs(dash: dict) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every panel target, its variables filled in."""
    panels = [q for p in dash["panels"] for q in (p, *p.get("panels", []))]
    return [(p["title"], _grafana(t["expr"])) for p in panels for t in p.get("targets", [])]


def _variables(dash: dict) -> list[tuple[str, str, str]]:
    """(name, series selector, label) of every `label_values(selector, label)` variable."""
    out = []
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            m = re.fullmatch(r"label_values\((.+), *(\w+)\)", var["definition"])
            assert m, var["definition"]
            out.append((var["name"], _grafana(m[1]), m[2]))
    return out


def _label_values(api: str, label: str, match: str) -> list[str]:
    r = httpx.get(f"{api}/api/v1/label/{label}/values", params={"match[]": match}, timeout=10, trust_env=False)
    return r.json().get("data") or []


def test_every_panel_query_finds_series(tmp_path):
    dash = json.loads(DASHBOARD.read_text())
    stats = LiveStats(sessions_active=2, sessions_done=1, turns=4, tool_calls=3, verdicts=Counter(timeout_total=1))
    exporter = HarnessExporter(stats, "e2e")
    handle = exporter.start(0)
    try:
        # Beside the bundled engine, a recorded SGLang decode page with priority breakdowns.
        with (
            start_engine(["--pd", "--num-pages", "1024"], log_dir=tmp_path) as engine,
            serving({"/metrics": page("sglang_pd_decode")}) as recorded,
        ):
            recorded_target = recorded.removeprefix("http://")
            targets = [u.removeprefix("http://").removesuffix("/metrics") for u in engine.metrics_urls]
            targets += [f"127.0.0.1:{handle.port}", recorded_target]
            with _prometheus(tmp_path, targets) as api:
                _wait(
                    "prometheus ready",
                    lambda: httpx.get(f"{api}/-/ready", timeout=2, trust_env=False).status_code == 200,
                )
                _wait("every target up", lambda: sum(float(s["value"][1]) for s in _query(api, "up")) == len(targets))
                # Traffic spread over a few scrapes, so every counter and histogram moves in the window.
                for i in range(6):
                    _chat(engine.url, i)
                    stats.turns += 1
                    stats.turns_corrupt += 1
                    stats.kills += 1
                    stats.verdicts["timeout_total"] += 1
                    time.sleep(0.5)
                time.sleep(2.5)  # the last of it scraped
                exprs = _exprs(dash)
                empty = [f"{title}: {expr}" for title, expr in exprs if not _query(api, expr)]
                empty += [
                    f"variable {name}: {match}"
                    for name, match, label in _variables(dash)
                    if not _label_values(api, label, match)
                ]
                transfer = next(
                    expr
                    for _, expr in exprs
                    if expr.startswith("sum by (instance) (sglang:num_decode_transfer_queue_reqs")
                )
                per_instance = {r["metric"]["instance"]: float(r["value"][1]) for r in _query(api, transfer)}
        assert not empty, "queries with no series:\n" + "\n".join(empty)
        # The total of the priority classes, not the total plus each class again.
        assert per_instance[recorded_target] == 12
    finally:
        exporter.shutdown()
