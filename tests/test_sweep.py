"""The sweep's pure parts: the levels' grammar, the Wilson interval against published values,
the stopping rule, the threshold, and the files a sweep writes."""

from __future__ import annotations

import json

import numpy
import pytest

from dsv4bench.harness.config import ConfigError
from dsv4bench.modes.sweep import (
    ABOVE,
    CLEAN,
    SEEN,
    Level,
    SweepPlan,
    level_verdict,
    parse_levels,
    run_level,
    stop_reason,
    sweep_markdown,
    sweep_summary,
    threshold,
    wilson_interval,
    write_sweep,
    z_score,
)


@pytest.mark.parametrize(
    "text, levels",
    [
        ("1,8,16,32,60,80", (1, 8, 16, 32, 60, 80)),
        ("16, 1 ,8,8", (1, 8, 16)),  # sorted and deduplicated
        ("1-4", (1, 2, 3, 4)),
        ("1..4", (1, 2, 3, 4)),
        ("1-80:8", (1, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80)),
        ("1..80 step 8", (1, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80)),
        ("4-20:4", (4, 8, 12, 16, 20)),
        ("2-10:4", (2, 4, 8, 10)),
        ("5-5", (5,)),
        ("1,2,32-64:16", (1, 2, 32, 48, 64)),
    ],
)
def test_levels_grammar(text, levels):
    assert parse_levels(text) == levels


@pytest.mark.parametrize(
    "text, says",
    [
        ("", "an item is empty"),
        ("1,,8", "an item is empty"),
        ("0,8", "at least 1"),
        ("eight", "is not a level"),
        ("1-80:0", "step must be at least 1"),
        ("80-1", "ends below its start"),
        ("1.5", "is not a level"),
        ("-3", "is not a level"),
        ("1-1000", "more than 64 levels"),
    ],
)
def test_bad_levels_are_one_line_config_errors(text, says):
    with pytest.raises(ConfigError, match=says) as e:
        parse_levels(text)
    assert "\n" not in str(e.value) and "--concurrency" in str(e.value)


def test_wilson_interval_matches_published_values():
    # statsmodels' proportion_confint(k, n, method="wilson") and Wilson's closed form.
    assert z_score(0.95) == pytest.approx(1.959964, abs=1e-6)
    assert wilson_interval(0, 10, 0.95) == pytest.approx((0.0, 0.277533), abs=1e-6)
    assert wilson_interval(1, 10, 0.95) == pytest.approx((0.017876, 0.404150), abs=1e-6)
    assert wilson_interval(5, 10, 0.95) == pytest.approx((0.236593, 0.763407), abs=1e-6)
    assert wilson_interval(10, 10, 0.95) == pytest.approx((0.722467, 1.0), abs=1e-6)


@pytest.mark.parametrize("k, n, confidence", [(81, 263, 0.95), (3, 100, 0.99), (12, 100, 0.90)])
def test_wilson_bounds_are_the_roots_of_the_score_equation(k, n, confidence):
    # Wilson's interval is where (k/n - p)^2 = z^2 p (1 - p) / n: the two roots of a quadratic in p.
    z2 = z_score(confidence) ** 2
    roots = sorted(numpy.roots([1 + z2 / n, -(2 * k / n + z2 / n), (k / n) ** 2]).real)
    assert wilson_interval(k, n, confidence) == pytest.approx(tuple(roots), abs=1e-12)


def test_wilson_interval_edges():
    assert wilson_interval(0, 0, 0.95) == (0.0, 1.0)  # no completed turn: nothing known
    lo, hi = wilson_interval(0, 10_000, 0.95)
    assert lo == 0.0 and 0 < hi < 0.0004  # exactly 0 below: a clean level is never above a 0 baseline
    assert wilson_interval(1, 10_000, 0.95)[0] > 0  # one corrupt turn shows corruption at baseline 0
    narrow, wide = wilson_interval(5, 10, 0.80), wilson_interval(5, 10, 0.99)
    assert wide[0] < narrow[0] and narrow[1] < wide[1]


def _summary(ok: int, corrupt: int, error: int = 0, depth: int = 0) -> dict:
    turns = {"total": ok + error, "ok": ok, "good": ok - corrupt, "killed": 0, "corrupt": corrupt, "error": error}
    return {"verdict": "CORRUPTION" if corrupt else "CLEAN", "turns": turns, "by_depth": {str(depth): turns}}


def _level(ok: int, corrupt: int, concurrency: int = 8) -> Level:
    level = Level(concurrency)
    level.add(_summary(ok, corrupt), f"c{concurrency}/run")
    return level


def test_stopping_rule():
    plan = SweepPlan((1,), precision=0.05, level_turns=1000)
    # 0 of 73 completed: Wilson's upper bound is 3.84/(73+3.84) = 0.04998, within 0.05.
    assert stop_reason(_level(72, 0), plan, 72) is None
    assert stop_reason(_level(73, 0), plan, 73) == "precision"
    assert stop_reason(_level(300, 30), plan, 300) is None  # 10% of 300: about 7 points wide
    assert stop_reason(_level(600, 60), plan, 600) == "precision"
    assert stop_reason(_level(999, 500), plan, 999) is None
    assert stop_reason(_level(1000, 500), plan, 1000) == "turn budget"
    assert stop_reason(_level(10, 5), plan, 0) == "no turns"  # a batch that ran nothing ends the level


def test_run_level_adds_batches_until_the_rule_stops_it():
    plan = SweepPlan((4,), precision=0.1, level_turns=10_000)
    asked = []

    def run_batch(concurrency: int, batch: int):
        asked.append((concurrency, batch))
        return _summary(20, 0, error=1, depth=batch), f"c{concurrency}/b{batch}"

    seen = []
    level = run_level(4, plan, run_batch, lambda lv, b: seen.append((b, lv.turns["ok"])))
    # 0 of n is within 0.1 wide once 3.84/(n+3.84) <= 0.1: n >= 35, so two batches of 20.
    assert asked == [(4, 0), (4, 1)] and seen == [(0, 20), (1, 40)]
    assert level.stopped_by == "precision" and level.runs == ["c4/b0", "c4/b1"]
    assert level.turns == {"total": 42, "ok": 40, "good": 40, "killed": 0, "corrupt": 0, "error": 2}
    assert sorted(level.by_depth) == [0, 1] and level.by_depth[1]["ok"] == 20


def test_run_level_stops_at_the_turn_budget():
    plan = SweepPlan((4,), precision=0.01, level_turns=50)
    level = run_level(4, plan, lambda c, b: (_summary(20, 2), f"b{b}"))
    assert len(level.runs) == 3 and level.stopped_by == "turn budget"


def test_threshold_is_the_first_level_whose_lower_bound_is_above_the_baseline():
    levels = [_level(200, 0, 1), _level(200, 1, 8), _level(200, 30, 16), _level(200, 60, 32)]
    at_zero = SweepPlan((1, 8, 16, 32))
    assert [level_verdict(lv, at_zero) for lv in levels] == [CLEAN, ABOVE, ABOVE, ABOVE]
    assert threshold(levels, at_zero) == 8
    # A baseline of 2%: one corrupt turn in 200 (interval 0.1%-2.8%) does not show more than it.
    with_baseline = SweepPlan((1, 8, 16, 32), baseline=0.02)
    assert [level_verdict(lv, with_baseline) for lv in levels] == [CLEAN, SEEN, ABOVE, ABOVE]
    assert threshold(levels, with_baseline) == 16
    assert threshold(levels[:1], at_zero) is None


@pytest.mark.parametrize(
    "kwargs, says",
    [
        ({"confidence": 1.0}, "--confidence"),
        ({"confidence": 0.0}, "--confidence"),
        ({"precision": 0.0}, "--precision"),
        ({"precision": 1.5}, "--precision"),
        ({"baseline": -0.1}, "--baseline"),
        ({"baseline": 1.0}, "--baseline"),
        ({"level_turns": 0}, "--level-turns"),
    ],
)
def test_bad_plan_settings(kwargs, says):
    with pytest.raises(ConfigError, match=says):
        SweepPlan((1,), **kwargs)


def test_sweep_files(tmp_path):
    plan = SweepPlan((1, 8, 16))
    levels = [_level(100, 0, 1), _level(100, 0, 8), _level(100, 12, 16)]
    for lv in levels:
        lv.stopped_by = "precision"
    summary = sweep_summary(levels, plan, "dsv4bench sweep --concurrency 1,8,16")
    assert summary["threshold"] == 16 and summary["verdict"] == "CORRUPTION"
    top = summary["levels"][2]
    assert top["rate"] == pytest.approx(0.12) and top["interval"] == list(wilson_interval(12, 100, 0.95))
    assert top["by_depth"]["0"]["turns"]["corrupt"] == 12
    md = sweep_markdown(summary)
    assert "Corruption appears at concurrency 16" in md
    assert "| 16 | 1 | 100 | 100 | 12 | 0 | 12.0% | 7.0% - 19.8% | precision | CORRUPTION |" in md
    assert "| 0 | 0/100 (0.0%) | 0/100 (0.0%) | 12/100 (12.0%) |" in md
    written = write_sweep(tmp_path, summary)
    assert [p.name for p in written] == ["sweep.json", "sweep.md", "sweep.png"]
    assert json.loads((tmp_path / "sweep.json").read_text()) == summary
    assert (tmp_path / "sweep.png").read_bytes()[:4] == b"\x89PNG"


def test_a_levels_goodput_adds_its_batches_up_and_a_level_without_targets_has_none():
    def with_slo(good: int, turns: int, tokens: int, window: float) -> dict:
        slo = {"turns": turns, "good": good, "good_output_tokens": tokens, "window_s": window, "share": 0.0}
        return {**_summary(turns, 0), "slo": slo}

    level = Level(8)
    level.add(with_slo(30, 40, 3000, 10.0), "c8/a")
    level.add(with_slo(10, 40, 1000, 10.0), "c8/b")
    # 40 good of 80 over 20 s of batches: 2 good turns/s, 200 good tokens/s
    assert level.slo_block() == {
        "turns": 80,
        "good": 40,
        "share": 0.5,
        "goodput_turns_per_s": 2.0,
        "goodput_tokens_per_s": 200.0,
    }
    plain = _level(100, 0, 16)
    assert plain.slo_block() is None
    unknown = Level(8)
    unknown.add(with_slo(30, 40, 3000, 10.0), "c8/a")
    unknown.add(
        {**_summary(40, 0), "slo": {"turns": 40, "good": 10, "good_output_tokens": 1000, "window_s": None}}, "c8/b"
    )
    block = unknown.slo_block()  # one batch's window unknown: the level's goodput is unknown, its counts are not
    assert block is not None and block["good"] == 40 and block["share"] == 0.5
    assert block["goodput_turns_per_s"] is None and block["goodput_tokens_per_s"] is None
    unreadable = Level(4)
    unreadable.add({**_summary(10, 0), "slo": {"spec": "x", "error": "bad"}}, "c4/a")
    assert unreadable.slo_block() is None
    md = sweep_markdown(sweep_summary([level, plain], SweepPlan((8, 16)), "dsv4bench sweep --slo ttft=1s"))
    assert "| 8 | 40 of 80 | 50.0% | 2.00 | 200.00 |" in md and "| 16 | " not in md.split("(--slo)")[1].split("##")[0]
