"""The wedge section and the queue timeline plot, on literal histories with metrics samples."""

from __future__ import annotations

import json
from pathlib import Path

from dsv4bench.history.run_folder import read_history
from dsv4bench.report import build_report
from dsv4bench.report.plots import active_sessions, queue_series

from .conftest import T0_NS, T0_WALL, S, _event

DECODE = "http://decode:30000/metrics"
PREFILL = "http://prefill:30000/metrics"
TRANSFER = 'sglang:num_decode_transfer_queue_reqs{engine_type="decode",model_name="m"}'
BOOTSTRAP = 'sglang:num_prefill_bootstrap_queue_reqs{engine_type="prefill",model_name="m"}'
RUNNING_D = 'sglang:num_running_reqs{engine_type="decode",model_name="m"}'
RUNNING_P = 'sglang:num_running_reqs{engine_type="prefill",model_name="m"}'


def _sample(at_s: float, endpoint: str, values: dict[str, float]) -> dict:
    return {
        "t_wall_ns": T0_WALL + int(at_s * S),
        "t_ns": T0_NS + int(at_s * S),
        "endpoint": endpoint,
        "ok": True,
        "values": values,
    }


def _samples() -> list[dict]:
    """Load for 10 s, kill at 6 s, load stops at 10 s: prefill drains, decode's transfer queue sticks at 58."""
    out = []
    for t in range(0, 21):
        transfer = min(58.0, 10.0 * t) if t >= 4 else 0.0
        out.append(
            _sample(
                t,
                DECODE,
                {
                    RUNNING_D: 4.0 if t < 10 else 0.0,
                    TRANSFER: transfer,
                    "sglang:num_decode_prealloc_queue_reqs": 0.0,
                    "sglang:num_requests_total": float(min(t, 10)),
                },
            )
        )
        out.append(_sample(t + 0.1, PREFILL, {RUNNING_P: 2.0 if t < 11 else 0.0, BOOTSTRAP: 3.0 if t < 12 else 0.0}))
    return out


WEDGE = {
    DECODE: {
        "codes": ["queue_stuck"],
        "gauges": {RUNNING_D: 0.0, TRANSFER: 58.0},
        "drain_s": None,
        "details": [f"{TRANSFER}=58 on {DECODE}, no progress for 10.0 s"],
    },
    PREFILL: {"codes": [], "gauges": {RUNNING_P: 0.0, BOOTSTRAP: 0.0}, "drain_s": 2.1, "details": []},
}


def _write(run_dir: Path, metrics: list[dict], wedge: dict | None) -> Path:
    run_dir.mkdir(parents=True)
    run = {"run": "wedge-test", "command": "dsv4bench agents --metrics-url ..."}
    if wedge is not None:
        run["wedge"] = wedge
    (run_dir / "run.json").write_text(json.dumps(run))
    (run_dir / "turns.jsonl").write_text("")
    events = [_event("run_start", 0.0)]
    events += [_event("session_start", 0.5 + i, session=f"s{i}") for i in range(3)]
    events += [
        _event("kill", 6.0, sessions=["s1"]),
        _event("session_end", 6.0, session="s1"),
        _event("load_stopped", 10.0),
        _event("session_end", 10.0, session="s0"),
        _event("session_end", 10.0, session="s2"),
        _event("drain_end", 20.0),
        _event("run_end", 21.0),
    ]
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    return run_dir


def test_wedge_report_has_table_drain_time_and_timeline(tmp_path: Path) -> None:
    run_dir = _write(tmp_path / "run", _samples(), WEDGE)
    summary = build_report(run_dir)
    md = (run_dir / "report.md").read_text()
    assert summary["verdict"] == "WEDGE"
    section = md.split("## Wedge", 1)[1].split("\n## ", 1)[0]
    # Summary row: codes, the stuck gauge with its value, drain time, canary.
    assert f"| {DECODE} | `queue_stuck` | num_decode_transfer_queue_reqs=58 | did not drain | not run |" in section
    assert f"| {PREFILL} | none | all 0 | 2.10 s |" in section
    assert "load stopped at 10.0 s; drain window ended at 20.0 s" in section
    # Per-endpoint table of gauges at the end of the window, the stuck one marked, and the details.
    assert f"| `{TRANSFER}` | transfer | 58 | **stuck** |" in section
    assert f"| `{BOOTSTRAP}` | bootstrap | 0 |  |" in section
    assert f"- {TRANSFER}=58 on {DECODE}, no progress for 10.0 s" in section
    assert "`queue_stuck` = a queue stuck with no progress" in section
    assert "No metrics endpoints were scraped" not in md
    # The timeline plot exists and is embedded.
    assert (run_dir / "plots" / "timeline_queues.png").stat().st_size > 5000
    assert "(plots/timeline_queues.png)" in md


def test_queue_series_keeps_running_and_gauges_that_rose(tmp_path: Path) -> None:
    history = read_history(_write(tmp_path / "run", _samples(), WEDGE))
    series = queue_series(history, T0_NS)
    assert list(series) == [
        f"num_running_reqs @ {DECODE}",
        f"num_decode_transfer_queue_reqs @ {DECODE}",
        f"num_running_reqs @ {PREFILL}",
        f"num_prefill_bootstrap_queue_reqs @ {PREFILL}",
    ]  # the all-zero prealloc queue is left out
    xs, ys = series[f"num_decode_transfer_queue_reqs @ {DECODE}"]
    assert xs[:2] == [0.0, 1.0] and ys[-1] == 58.0
    assert active_sessions(history, T0_NS) == ([0.0, 0.5, 1.5, 2.5, 6.0, 10.0, 10.0], [0, 1, 2, 3, 2, 1, 0])


def test_no_metrics_means_no_queue_timeline_and_the_section_says_so(tmp_path: Path) -> None:
    run_dir = _write(tmp_path / "run", [], {})
    build_report(run_dir)
    md = (run_dir / "report.md").read_text()
    assert "Wedge not checked (no --metrics endpoint): no queue gauge could be judged" in md
    assert not (run_dir / "plots" / "timeline_queues.png").exists()
    assert "timeline_queues.png" not in md


def test_failed_scrapes_are_skipped(tmp_path: Path) -> None:
    bad = [{"t_wall_ns": T0_WALL, "t_ns": T0_NS, "endpoint": DECODE, "ok": False, "error": "ConnectError"}]
    history = read_history(_write(tmp_path / "run", bad + _samples()[:4], None))
    assert set(queue_series(history, T0_NS)) == {
        f"num_running_reqs @ {DECODE}",
        f"num_running_reqs @ {PREFILL}",
        f"num_prefill_bootstrap_queue_reqs @ {PREFILL}",
    }


def test_the_canary_column_tells_a_hang_from_an_error_answer():
    from dsv4bench.report.markdown import _canary

    hung = {
        "codes": ["canary_timeout"],
        "canary": {"ok": False, "result": "timeout", "latency_s": 10.0, "error": "timeout after 10 s"},
    }
    answered = {
        "codes": [],
        "canary": {
            "ok": False,
            "result": "error",
            "http_status": 404,
            "latency_s": 0.01,
            "error": "HTTP 404: not found",
        },
    }
    assert _canary(hung).startswith("hung")
    assert _canary(answered).startswith("error: HTTP 404") and "hung" not in _canary(answered)
    assert _canary({"codes": [], "canary": {"ok": True, "latency_s": 0.2}}).startswith("ok")


def test_a_servers_endpoint_text_is_a_plain_label_and_costs_no_plot(tmp_path: Path) -> None:
    # A worker's URL comes from a router's /workers: `$...$` in it would be drawn as mathtext (and
    # a malformed one fails the whole figure), ESC and bidi controls would land in the picture.
    hostile = "http://w:1/$\\frac{$\x1b[2J\u202e"
    samples = [{**s, "endpoint": hostile if s["endpoint"] == DECODE else s["endpoint"]} for s in _samples()]
    run_dir = _write(tmp_path / "run", samples, None)
    history = read_history(run_dir)
    labels = list(queue_series(history, T0_NS))
    assert "num_decode_transfer_queue_reqs @ http://w:1/\\$\\frac{\\$\\x1b[2J\\u202e" in labels
    build_report(run_dir)
    assert (run_dir / "plots" / "timeline_queues.png").exists()
