"""--serve-metrics: the harness exporter over HTTP, and the shipped Grafana dashboard."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dsv4bench.harness.exporter import METRIC_NAMES, ExporterError, HarnessExporter
from dsv4bench.harness.progress import LiveStats
from dsv4bench.engine.metrics import METRIC_NAMES as ENGINE_METRIC_NAMES

DASHBOARD = Path(__file__).resolve().parents[1] / "dashboards" / "dsv4bench-sglang-pd.json"


def _scrape(port: int) -> dict[str, float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", trust_env=False, timeout=5).text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


def test_scrape_follows_live_stats() -> None:
    stats = LiveStats()
    exporter = HarnessExporter(stats, "run-x")
    handle = exporter.start(0)
    try:
        first = _scrape(handle.port)
        assert first["dsv4bench_sessions_active{run=run-x}"] == 0
        assert first["dsv4bench_kills_total{run=run-x}"] == 0  # LiveStats without `kills` reads 0
        stats.sessions_active, stats.sessions_done = 5, 2
        stats.turns, stats.turns_killed, stats.turns_error, stats.turns_corrupt = 10, 1, 2, 3
        stats.tool_calls = 17
        stats.verdicts.update({"dsml_leak_content": 2, "http_error": 2})
        stats.kills = 4  # the nemesis adds this field
        m = _scrape(handle.port)
    finally:
        exporter.shutdown()
    assert m["dsv4bench_sessions_active{run=run-x}"] == 5
    assert m["dsv4bench_sessions_done_total{run=run-x}"] == 2
    assert m["dsv4bench_turns_total{run=run-x,status=ok}"] == 7
    assert m["dsv4bench_turns_total{run=run-x,status=killed}"] == 1
    assert m["dsv4bench_turns_total{run=run-x,status=error}"] == 2
    assert m["dsv4bench_turns_corrupt_total{run=run-x}"] == 3
    assert m["dsv4bench_tool_calls_total{run=run-x}"] == 17
    assert m["dsv4bench_verdicts_total{code=dsml_leak_content,run=run-x}"] == 2
    assert m["dsv4bench_verdicts_total{code=http_error,run=run-x}"] == 2
    assert m["dsv4bench_kills_total{run=run-x}"] == 4
    # Nothing from prometheus_client's global registry (process/gc collectors) leaks in.
    assert not any(k.startswith(("process_", "python_")) for k in m)


def test_with_slo_the_scrape_gives_the_turns_against_the_targets_and_the_goodput() -> None:
    from dsv4bench.report.slo import SloTargets, tally_for
    from tests.report.test_slo import turn

    stats = LiveStats(slo=tally_for(SloTargets(ttft_s=0.5, itl_s=0.05)))
    for t in (
        turn(ttft_s=0.1, tokens=30),  # met
        turn(ttft_s=0.1, tokens=50),  # met
        turn(ttft_s=0.9),  # missed
        turn(verdicts=[("args_not_json", "tool_calls[0].arguments")]),  # corrupt
        turn(status="killed"),  # not counted
    ):
        stats.add_turn(t)
    exporter = HarnessExporter(stats, "run-x")
    handle = exporter.start(0)
    try:
        before = stats.elapsed
        m = _scrape(handle.port)
        after = stats.elapsed
    finally:
        exporter.shutdown()
    assert m["dsv4bench_slo_target_seconds{run=run-x,target=ttft}"] == 0.5
    assert m["dsv4bench_slo_target_seconds{run=run-x,target=itl}"] == 0.05
    assert "dsv4bench_slo_target_seconds{run=run-x,target=e2e}" not in m
    outcomes = {
        o: m[f"dsv4bench_slo_turns_total{{outcome={o},run=run-x}}"] for o in ("met", "missed", "corrupt", "failed")
    }
    assert outcomes == {"met": 2, "missed": 1, "corrupt": 1, "failed": 0}
    assert not any("outcome=killed" in k for k in m)
    assert m["dsv4bench_slo_good_output_tokens_total{run=run-x}"] == 80
    assert m["dsv4bench_slo_good_share{run=run-x}"] == pytest.approx(0.5)
    # Per second of the run so far: the 2 good turns over the time elapsed when it was scraped.
    assert 2 / after <= m["dsv4bench_goodput_turns_per_second{run=run-x}"] <= 2 / before
    assert m["dsv4bench_goodput_tokens_per_second{run=run-x}"] == pytest.approx(
        40 * m["dsv4bench_goodput_turns_per_second{run=run-x}"]
    )


def test_without_slo_no_slo_family_is_exposed() -> None:
    exporter = HarnessExporter(LiveStats(), "run-x")
    handle = exporter.start(0)
    try:
        m = _scrape(handle.port)
    finally:
        exporter.shutdown()
    assert not any("slo" in k or "goodput" in k for k in m)


def test_port_in_use_is_one_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ExporterError, match=f"127.0.0.1:{port} is already in use") as err:
            HarnessExporter(LiveStats(), "r").start(port)
    assert "\n" not in str(err.value)


def test_shutdown_is_idempotent() -> None:
    exporter = HarnessExporter(LiveStats(), "r")
    exporter.start(0)
    exporter.shutdown()
    exporter.shutdown()


# --- the dashboard ---------------------------------------------------------------------------


def _panels(dash: dict) -> list[dict]:
    out = []
    for p in dash["panels"]:
        out.append(p)
        out += p.get("panels", [])
    return out


_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_PROMQL_WORDS = {"sum", "by", "rate", "increase", "histogram_quantile", "le", "without", "avg", "max", "min"}


def _family(metric: str) -> str:
    for suffix in ("_bucket", "_total", "_sum", "_count"):
        if metric.endswith(suffix):
            return metric[: -len(suffix)]
    return metric


def _metrics_in(expr: str) -> set[str]:
    """Metric names in a PromQL expr: identifiers not inside {...}/[...]/strings nor functions."""
    stripped = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", expr)
    stripped = re.sub(r"by \([^)]*\)", " ", stripped)
    names = set(_IDENT.findall(stripped))
    return {n for n in names if n not in _PROMQL_WORDS and not re.fullmatch(r"[0-9.]+", n)}


def test_dashboard_is_valid_grafana_json_naming_known_metrics() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert 36 <= dash["schemaVersion"] <= 41
    names = {v["name"] for v in dash["templating"]["list"]}
    assert {"DS_PROMETHEUS", "model_name", "engine_type"} <= names
    known = set(ENGINE_METRIC_NAMES) | set(METRIC_NAMES)
    exprs = [t["expr"] for p in _panels(dash) for t in p.get("targets", [])]
    assert exprs
    ids = [p["id"] for p in _panels(dash)]
    assert len(ids) == len(set(ids))
    seen = set()
    for p in _panels(dash):
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${DS_PROMETHEUS}"
        for t in p["targets"]:
            metrics = _metrics_in(t["expr"])
            assert metrics, t["expr"]
            for m in metrics:
                assert _family(m) in known, f"{p['title']}: {m} is exported by neither the engine nor dsv4bench"
            seen |= {_family(m) for m in metrics}
    # The incident's gauges and the corruption signal are both on it.
    assert {
        "sglang:num_decode_transfer_queue_reqs",
        "sglang:num_prefill_bootstrap_queue_reqs",
        "dsv4bench_turns_corrupt",
        "dsv4bench_verdicts",
        "dsv4bench_kills",
    } <= seen


def test_agents_serve_metrics_port_taken_is_one_line(tmp_path):
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        # A server is needed only to get past the preflight; the replay server is enough.
        from tests.e2e.conftest import start_replay

        srv = start_replay(tmp_path, fault_rate=0)
        try:
            r = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "dsv4bench",
                    "agents",
                    "--url",
                    srv.url,
                    "--sessions",
                    "1",
                    "--quiet",
                    "--out",
                    str(tmp_path / "runs"),
                    "--serve-metrics",
                    str(port),
                ],
                capture_output=True,
                text=True,
                timeout=60,
            )
        finally:
            srv.stop()
    assert r.returncode == 2 and "already in use" in r.stderr and "Traceback" not in r.stderr
