"""The report's header table of the deployment discovery found (run.json server.deployment),
summary.json's copy of it, and the plots' gauge order across metric generations."""

from __future__ import annotations

import json
from pathlib import Path

from dsv4bench.servers.dialect import INFIGHT, PREFILL_PREALLOC
from dsv4bench.servers.discovery import Endpoint, RootAnswers, endpoint_of
from dsv4bench.history.run_folder import read_history
from dsv4bench.report.markdown import deployment_section, render_report
from dsv4bench.report.plots import queue_series
from dsv4bench.report.summary import summarize

from .conftest import T0_NS

FIXTURES = Path(__file__).parents[1] / "fixtures" / "discovery"
R, P, D = "http://10.0.0.1:8000", "http://10.0.0.2:30000", "http://10.0.0.3:30002"


def _deployment() -> dict:
    def info(name: str) -> dict:
        return json.loads((FIXTURES / name).read_text())

    router = endpoint_of(
        R, RootAnswers(info=info("sglang_router_server_info.json"), workers=info("sglang_router_pd_workers.json"))
    )
    prefill = endpoint_of(P, RootAnswers(info=info("sglang_pd_prefill_server_info.json"), metrics={"sglang:x": 1.0}))
    decode = endpoint_of(D, RootAnswers(problems=["/get_server_info: no answer in 5 s", "/metrics: no answer in 5 s"]))
    decode.role, decode.listed_as = "decode", "decode"
    eps = [router, prefill, decode]
    return {"given": [R], "found_via": [R], "endpoints": [e.__dict__ for e in eps]}


def test_the_header_lists_each_server_with_its_settings(run_folder, make_turn) -> None:
    run = {
        "run": "d",
        "command": "dsv4bench agents",
        "config": {"metrics": [f"{P}/metrics"]},
        "server": {"deployment": _deployment(), "metrics_dialect": {"name": "sglang", "generation": "bootstrap"}},
    }
    run_dir = run_folder([make_turn()], run=run)
    history = read_history(run_dir)
    summary = summarize(history)
    md = render_report(history, summary, [])
    header = md.split("## Run", 1)[0]
    assert "**Deployment** (3 servers, from `http://10.0.0.1:8000` `/workers`):" in header
    assert "|  | router `10.0.0.1:8000` | prefill `10.0.0.2:30000` | decode `10.0.0.3:30002` |" in header
    assert "| `disaggregation_transfer_backend` | – | mooncake | – |" in header
    assert "| `disable_overlap_schedule` | – | on | – |" in header
    assert "| answered | yes | yes | no: /get_server_info: no answer in 5 s; /metrics: no answer in 5 s |" in header
    assert "Scraped during the run: `http://10.0.0.2:30000/metrics`." in header
    assert "| metrics dialect | sglang (bootstrap) |" in md  # the Server section
    assert [e["role"] for e in summary["deployment"]["endpoints"]] == ["router", "prefill", "decode"]


def test_a_run_without_a_deployment_has_no_table(run_folder, make_turn) -> None:
    for server in (None, {"deployment": "garbage"}, {"deployment": {"endpoints": []}}):
        history = read_history(run_folder([make_turn()], run={"run": "x", "server": server}))
        assert deployment_section(history) == [] and summarize(history)["deployment"] is None
    assert Endpoint("http://a:1").shown_settings() == []


def test_plots_order_old_and_current_gauge_names_alike(run_folder, make_turn) -> None:
    values = {
        f'{INFIGHT}{{engine_type="prefill"}}': 1.0,
        'sglang:num_running_reqs{engine_type="prefill"}': 1.0,
        f'{PREFILL_PREALLOC}{{engine_type="prefill"}}': 2.0,
    }
    run_dir = run_folder([make_turn()])
    (run_dir / "metrics.jsonl").write_text(
        json.dumps({"endpoint": "p", "ok": True, "t_ns": T0_NS, "t_wall_ns": 0, "values": values}) + "\n"
    )
    labels = list(queue_series(read_history(run_dir), T0_NS))
    assert [label.split(" @ ")[0] for label in labels] == [
        "num_running_reqs",
        "num_prefill_prealloc_queue_reqs",
        "num_prefill_infight_queue_reqs",
    ]
