"""Where it started (dsv4bench/report/onset.py): the first finding of each code, and the series
that moved before it, on recorded metrics: what moved is named, what only wobbled or grew
steadily is not."""

from __future__ import annotations

import random

from dsv4bench.history.run_folder import read_history
from dsv4bench.report.onset import first_findings, first_findings_block, moved_metrics, per_interval
from tests.report.conftest import S, T0_WALL, _make_turn, write_run

EP = "http://127.0.0.1:30000/metrics"


def scrapes(seconds: int, values_at) -> list[dict]:
    """One good scrape a second for `seconds`; `values_at(t)` gives its {series: value}."""
    return [
        {"t_wall_ns": T0_WALL + t * S, "t_ns": t * S, "endpoint": EP, "ok": True, "values": values_at(t)}
        for t in range(seconds)
    ]


def steady(t: int) -> dict[str, float]:
    """What a healthy server's metrics do: requests counted at a steady 5/s, a cache hit rate
    that wobbles around 0.6, a histogram's buckets."""
    rng = random.Random(t)
    return {
        "sglang:num_requests_total": 5.0 * t,
        "sglang:cache_hit_rate": 0.6 + rng.uniform(-0.02, 0.02),
        'sglang:e2e_request_latency_seconds_bucket{le="1.0"}': float(t * (t % 7)),
    }


def test_a_gauge_that_dropped_in_the_minute_before_is_named_with_its_levels() -> None:
    def values(t: int) -> dict[str, float]:
        v = steady(t)
        if t >= 150:  # 30 s before the finding at 180 s, the hit rate collapses
            v["sglang:cache_hit_rate"] = 0.05
        return v

    moved = moved_metrics(scrapes(181, values), T0_WALL + 180 * S, T0_WALL)
    assert [m.series for m in moved] == ["sglang:cache_hit_rate"]
    m = moved[0]
    assert m.kind == "level" and m.endpoint == EP
    assert 0.58 < m.before < 0.62 and 0.3 < m.after < 0.35  # the window's mean: half high, half collapsed


def test_a_counter_whose_rate_changed_is_named_by_its_rate() -> None:
    def values(t: int) -> dict[str, float]:
        v = steady(t)
        v["sglang:num_aborted_requests_total"] = 0.0 if t < 150 else 10.0 * (t - 150)
        return v

    moved = moved_metrics(scrapes(181, values), T0_WALL + 180 * S, T0_WALL)
    assert moved[0].series == "sglang:num_aborted_requests_total"
    assert moved[0].kind == "rate" and moved[0].before == 0 and moved[0].after > 4


def test_clean_lookalikes_nothing_moved_nothing_named() -> None:
    # A steadily growing counter, a gauge wobbling as it always did, histogram buckets: none moved.
    assert moved_metrics(scrapes(181, steady), T0_WALL + 180 * S, T0_WALL) == []
    # Constant values: nothing at all to name.
    assert moved_metrics(scrapes(181, lambda t: {"sglang:num_queue_reqs": 3.0}), T0_WALL + 180 * S, T0_WALL) == []


def test_a_counter_reset_is_not_a_negative_rate() -> None:
    points = [(0, 10.0), (S, 20.0), (2 * S, 3.0)]
    assert per_interval(points, counter=True) == [(S, 10.0), (2 * S, 3.0)]


def test_an_early_finding_compares_the_two_halves_of_the_time_before_it() -> None:
    def values(t: int) -> dict[str, float]:
        return {"sglang:spec_accept_length": 3.0 if t <= 10 else 1.0}

    moved = moved_metrics(scrapes(21, values), T0_WALL + 20 * S, T0_WALL)
    assert [(m.series, m.before, m.after) for m in moved] == [("sglang:spec_accept_length", 3.0, 1.0)]
    # Too few points on either side: nothing is compared.
    assert moved_metrics(scrapes(3, values), T0_WALL + 2 * S, T0_WALL) == []


def test_only_the_top_few_most_first() -> None:
    def values(t: int) -> dict[str, float]:
        late = t >= 150
        return {f"g{i}": 1.0 + (i if late else 0) for i in range(1, 6)}

    moved = moved_metrics(scrapes(181, values), T0_WALL + 180 * S, T0_WALL, top=2)
    assert [m.series for m in moved] == ["g5", "g4"]


def test_first_finding_of_each_code_with_its_session_turn_and_time(tmp_path) -> None:
    turns = [
        _make_turn("s1", 0, start_s=1),
        _make_turn("s1", 1, verdicts=[("dsml_leak_content", "content")], tool_calls=0, start_s=30, e2e_s=2.0),
        _make_turn("s2", 3, verdicts=[("dsml_leak_content", "content")], tool_calls=0, start_s=20, e2e_s=1.0),
        _make_turn("s2", 4, verdicts=[("markup_unproven", "content")], start_s=5),  # evidence: never a finding
        _make_turn("s3", 0, status="killed", verdicts=[("truncated", "")], start_s=2),  # killed: not judged
        _make_turn("s3", 1, status="error", verdicts=[("http_error", "")], error="HTTP 503", start_s=40, e2e_s=0.5),
    ]
    run_dir = write_run(tmp_path / "run", turns)
    (run_dir / "metrics.jsonl").write_text(
        "".join(
            __import__("json").dumps(m) + "\n"
            for m in scrapes(60, lambda t: {"sglang:cache_hit_rate": 0.6 if t < 15 else 0.1})
        )
    )
    history = read_history(run_dir)
    found = first_findings(history)
    assert list(found) == ["dsml_leak_content", "http_error"]
    first = found["dsml_leak_content"]
    assert (first.session, first.turn, first.t_s) == ("s2", 3, 21.0)
    assert [m.series for m in first.moved] == ["sglang:cache_hit_rate"]
    block = first_findings_block(history)
    assert block["http_error"]["t_s"] == 40.5 and block["http_error"]["session"] == "s3"
    assert block["dsml_leak_content"]["moved"][0]["after"] < block["dsml_leak_content"]["moved"][0]["before"]


def test_a_clean_run_has_no_first_findings(tmp_path) -> None:
    history = read_history(write_run(tmp_path / "run", [_make_turn("s1", 0), _make_turn("s1", 1, start_s=2)]))
    assert first_findings(history) == {}


def test_the_timeline_marks_the_first_finding_of_each_code(tmp_path) -> None:
    from dsv4bench.report.plots import first_finding_marks, timeline_figure

    turns = [
        _make_turn("s1", 0, verdicts=[("schema_violation", "tool_calls[0].arguments")], start_s=10, e2e_s=1.0),
        _make_turn("s1", 1, verdicts=[("schema_violation", "tool_calls[0].arguments")], start_s=4, e2e_s=1.0),
        _make_turn("s2", 0, verdicts=[("empty_turn", "")], tool_calls=0, start_s=20, e2e_s=2.0),
    ]
    history = read_history(write_run(tmp_path / "run", turns))
    assert first_finding_marks(history, T0_WALL) == [(5.0, "schema_violation"), (22.0, "empty_turn")]
    assert timeline_figure(history) is not None  # drawn with its marks
    clean = read_history(write_run(tmp_path / "clean", [_make_turn("s1", 0)]))
    assert first_finding_marks(clean, T0_WALL) == []
