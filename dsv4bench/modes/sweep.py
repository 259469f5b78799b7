"""`dsv4bench sweep`: where corruption starts as concurrency rises. The pure parts: the grammar
of the levels, the per-level stopping rule, the Wilson score interval, the threshold, and the
sweep's summary (sweep.json), markdown report (sweep.md) and plot (sweep.png). The command
(cli/sweep.py) only runs the batches these functions ask for.

Levels (`--concurrency`): comma-separated items, each a number or a range, sorted and
deduplicated into rising levels:
- `N`: that level, e.g. `1,8,16,32,60,80`;
- `A-B` or `A..B`: every level from A to B;
- `A-B:S`, `A..B:S` or `A..B step S`: A, every multiple of S above A and below B, and B;
  so `1-80:8` is 1, 8, 16, ..., 72, 80 and `4-20:4` is 4, 8, 12, 16, 20.

Stopping rule, per level: run one batch (a whole `agents` run: the batch's sessions at that
concurrency), add its turns to the level's, and stop when the Wilson score interval of the
level's corrupt-turn rate (corrupt turns / completed turns, the summary's `corrupt_rate`) at
`confidence` is at most `precision` wide (upper bound minus lower bound), or when the level
has run `level_turns` turns (any outcome), or when a batch adds no turn at all (a dead server
must not loop forever). Batch k of every level is seeded `seed + k`, so every level replays
the same tasks in the same order.

Threshold: the smallest level whose interval's lower bound is above `baseline` (default 0: any
corrupt turn at all, since a correct server has none), i.e. the first level at which corruption
is shown at the stated confidence, not merely seen once as noise above a known baseline rate.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # matplotlib loads in ~0.4 s: the plot imports it where it draws, not every CLI start
    from matplotlib.figure import Figure

from dsv4bench.harness.config import ConfigError
from dsv4bench.report.blocks import code_span
from dsv4bench.report.slo import per_second
from dsv4bench.report.summary import VERDICTS

log = logging.getLogger(__name__)

SWEEP_VERSION = 1
SWEEP_JSON = "sweep.json"
SWEEP_MD = "sweep.md"
SWEEP_PNG = "sweep.png"
MAX_LEVELS = 64  # a sweep of more levels than this is a typo (a step left out), not a plan
OUTCOME_KEYS = ("total", "ok", "good", "killed", "corrupt", "error")

# The verdict of one level, by where its interval lies against the baseline.
ABOVE = "CORRUPTION"  # the lower bound is above the baseline: corruption shown at the confidence
SEEN = "NOT SHOWN"  # corrupt turns seen, but the interval reaches down to the baseline
CLEAN = "CLEAN"  # no corrupt turn

_RANGE = re.compile(r"^(\d+)\s*(?:-|\.\.)\s*(\d+)(?:\s*(?::|\s+step\s+)\s*(\d+))?$")


def parse_levels(text: str) -> tuple[int, ...]:
    """`--concurrency` text -> the rising levels (grammar in the module docstring); ConfigError
    naming the bad item."""
    levels: set[int] = set()
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise ConfigError(f"--concurrency {text!r}: give levels as 1,8,16 or a range as 1-80:8 (an item is empty)")
    for item in items:
        if item.isdigit():
            levels.add(_level(int(item), item))
            continue
        m = _RANGE.match(item)
        if m is None:
            raise ConfigError(f"--concurrency {item!r} is not a level (N) or a range (A-B, A-B:S, A..B step S)")
        lo, hi = _level(int(m.group(1)), item), _level(int(m.group(2)), item)
        step = int(m.group(3)) if m.group(3) else 1
        if hi < lo:
            raise ConfigError(f"--concurrency {item!r}: the range ends below its start")
        if step < 1:
            raise ConfigError(f"--concurrency {item!r}: the step must be at least 1")
        levels.update([lo, *range((lo // step + 1) * step, hi, step), hi])
        if len(levels) > MAX_LEVELS:
            break
    if len(levels) > MAX_LEVELS:
        raise ConfigError(f"--concurrency {text!r} gives more than {MAX_LEVELS} levels; use a larger step")
    return tuple(sorted(levels))


def _level(n: int, item: str) -> int:
    if n < 1:
        raise ConfigError(f"--concurrency {item!r}: every level must be at least 1")
    return n


def z_score(confidence: float) -> float:
    """The two-sided normal quantile of `confidence` (1.96 at 0.95)."""
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def wilson_interval(k: int, n: int, confidence: float) -> tuple[float, float]:
    """The Wilson score interval of k successes in n trials at `confidence`; (0, 1) when n is 0.
    Chosen over the normal approximation because it stays inside 0..1 and is not zero-width at
    k = 0, the case a clean level always is."""
    if n <= 0:
        return 0.0, 1.0
    z = z_score(confidence)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # Exact at the ends: floating point must not turn k = 0 into a lower bound of 1e-17 > baseline 0.
    lower = 0.0 if k == 0 else max(0.0, centre - half)
    upper = 1.0 if k == n else min(1.0, centre + half)
    return lower, upper


@dataclass(frozen=True)
class SweepPlan:
    """What the sweep runs and how it judges: the levels and the stopping rule's settings."""

    levels: tuple[int, ...]
    confidence: float = 0.95
    precision: float = 0.05  # the widest interval (upper minus lower) at which a level stops
    baseline: float = 0.0  # a level is above it when its interval's lower bound is
    level_turns: int = 2000  # turns after which a level stops whatever its interval

    def __post_init__(self) -> None:
        if not self.levels:
            raise ConfigError("--concurrency gives no level")
        if not 0 < self.confidence < 1:
            raise ConfigError(f"--confidence must be between 0 and 1 (e.g. 0.95), got {self.confidence:g}")
        if not 0 < self.precision <= 1:
            raise ConfigError(f"--precision must be above 0 and at most 1 (an interval width), got {self.precision:g}")
        if not 0 <= self.baseline < 1:
            raise ConfigError(f"--baseline must be a rate from 0 up to 1, got {self.baseline:g}")
        if self.level_turns < 1:
            raise ConfigError("--level-turns must be at least 1")


@dataclass
class Level:
    """One concurrency level: its batches' run folders and summaries, their turns added up."""

    concurrency: int
    runs: list[str] = field(default_factory=list)
    verdicts: list[str] = field(default_factory=list)  # each batch's summary verdict
    turns: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOME_KEYS, 0))
    by_depth: dict[int, dict[str, int]] = field(default_factory=dict)
    stopped_by: str = ""
    # --slo: each batch's counted and good turns, good output tokens and window, added up (None
    # where a batch did not say: a window unknown in one batch leaves the level's goodput unknown)
    slo: dict[str, float | None] | None = None

    def add(self, summary: dict[str, Any], run_dir: str) -> None:
        self.runs.append(run_dir)
        self.verdicts.append(str(summary.get("verdict", "?")))
        _add_counts(self.turns, summary.get("turns") or {})
        for depth, counts in (summary.get("by_depth") or {}).items():
            _add_counts(self.by_depth.setdefault(int(depth), dict.fromkeys(OUTCOME_KEYS, 0)), counts)
        slo = summary.get("slo")
        if isinstance(slo, dict) and "error" not in slo:
            into: dict[str, float | None] = self.slo if self.slo is not None else dict.fromkeys(_SLO_SUMS, 0.0)
            for key in _SLO_SUMS:
                value, so_far = slo.get(key), into[key]
                into[key] = so_far + value if isinstance(value, (int, float)) and so_far is not None else None
            self.slo = into

    def slo_block(self) -> dict[str, Any] | None:
        """The level's goodput against --slo over its batches (their windows added up); None
        without targets."""
        if self.slo is None:
            return None
        turns, good, tokens, window = (self.slo[key] for key in _SLO_SUMS)
        return {
            "turns": int(turns or 0),
            "good": int(good or 0),
            "share": good / turns if good is not None and turns else None,
            "goodput_turns_per_s": per_second(good, window) if good is not None else None,
            "goodput_tokens_per_s": per_second(tokens, window) if tokens is not None else None,
        }

    def interval(self, confidence: float) -> tuple[float, float]:
        return wilson_interval(self.turns["corrupt"], self.turns["ok"], confidence)


# The --slo figures of a batch's summary that add up over a level's batches (report/slo.py).
_SLO_SUMS = ("turns", "good", "good_output_tokens", "window_s")


def _add_counts(into: dict[str, int], counts: dict[str, Any]) -> None:
    for key in OUTCOME_KEYS:
        into[key] += int(counts.get(key) or 0)


def stop_reason(level: Level, plan: SweepPlan, batch_turns: int) -> str | None:
    """Why `level` stops after a batch that ran `batch_turns` turns, or None to run another."""
    lower, upper = level.interval(plan.confidence)
    if level.turns["ok"] and upper - lower <= plan.precision:
        return "precision"
    if level.turns["total"] >= plan.level_turns:
        return "turn budget"
    if batch_turns == 0:
        return "no turns"
    return None


BatchRunner = Callable[[int, int], tuple[dict[str, Any], str]]  # (concurrency, batch) -> (summary, run dir)


def run_level(
    concurrency: int, plan: SweepPlan, run_batch: BatchRunner, on_batch: Callable[[Level, int], None] | None = None
) -> Level:
    """Batches at `concurrency` until the stopping rule says stop (module docstring);
    `on_batch(level, batch)` sees the level after each batch (progress)."""
    level = Level(concurrency)
    batch = 0
    while True:
        summary, run_dir = run_batch(concurrency, batch)
        level.add(summary, run_dir)
        if on_batch is not None:
            on_batch(level, batch)
        reason = stop_reason(level, plan, int((summary.get("turns") or {}).get("total") or 0))
        batch += 1
        if reason is not None:
            level.stopped_by = reason
            return level


def level_verdict(level: Level, plan: SweepPlan) -> str:
    if not level.turns["corrupt"]:
        return CLEAN
    return ABOVE if level.interval(plan.confidence)[0] > plan.baseline else SEEN


def threshold(levels: list[Level], plan: SweepPlan) -> int | None:
    """The smallest concurrency whose interval's lower bound is above the baseline; None if none."""
    return next((lv.concurrency for lv in levels if level_verdict(lv, plan) == ABOVE), None)


def worst_verdict(verdicts: list[str]) -> str:
    """The worst of the batches' run verdicts, in summary.py's order (CLEAN when none ran)."""
    return next((v for v in VERDICTS if v in verdicts), "CLEAN")


def _rate_block(k: int, n: int, confidence: float) -> dict[str, Any]:
    lower, upper = wilson_interval(k, n, confidence)
    return {"rate": k / n if n else None, "interval": [lower, upper]}


def sweep_summary(levels: list[Level], plan: SweepPlan, command: str) -> dict[str, Any]:
    """The content of sweep.json: the plan, each level's turns, rate, interval, stop and verdict
    (and per turn depth), and the threshold."""
    return {
        "sweep_version": SWEEP_VERSION,
        "command": command,
        "confidence": plan.confidence,
        "precision": plan.precision,
        "baseline": plan.baseline,
        "level_turns": plan.level_turns,
        "interval_method": "wilson",
        "threshold": threshold(levels, plan),
        "verdict": worst_verdict([v for lv in levels for v in lv.verdicts]),
        "levels": [
            {
                "concurrency": lv.concurrency,
                "batches": len(lv.runs),
                "runs": lv.runs,
                "run_verdicts": lv.verdicts,
                "turns": lv.turns,
                **_rate_block(lv.turns["corrupt"], lv.turns["ok"], plan.confidence),
                "stopped_by": lv.stopped_by,
                "verdict": level_verdict(lv, plan),
                "by_depth": {
                    str(d): {"turns": c, **_rate_block(c["corrupt"], c["ok"], plan.confidence)}
                    for d, c in sorted(lv.by_depth.items())
                },
                "slo": lv.slo_block(),
            }
            for lv in levels
        ],
    }


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def sweep_markdown(summary: dict[str, Any]) -> str:
    """sweep.md: the threshold in words, a table per level, and one per turn depth."""
    conf = f"{100 * summary['confidence']:g}%"
    found = summary["threshold"]
    base = summary["baseline"]
    above = "any corruption" if not base else f"a corrupt-turn rate above {_pct(base)}"
    headline = (
        f"**Corruption appears at concurrency {found}**: the smallest level whose {conf} interval shows {above}."
        if found is not None
        else f"**No level shows {above}** at {conf} confidence."
    )
    lines = [
        "# Concurrency sweep",
        "",
        headline,
        "",
        f"Rate: corrupt turns / completed turns; interval: Wilson score at {conf}. A level ran batches until its "
        f"interval was at most {_pct(summary['precision'])} wide or it had run {summary['level_turns']} turns.",
        "",
        "| concurrency | batches | turns | completed | corrupt | error | rate | interval | stopped by | verdict |",
        "|---:|---:|---:|---:|---:|---:|---:|---|---|---|",
    ]
    for lv in summary["levels"]:
        t = lv["turns"]
        lo, hi = lv["interval"]
        lines.append(
            f"| {lv['concurrency']} | {lv['batches']} | {t['total']} | {t['ok']} | {t['corrupt']} | "
            f"{t['error']} | {_pct(lv['rate'])} | {_pct(lo)} - {_pct(hi)} | {lv['stopped_by']} | "
            f"{lv['verdict']} |"
        )
    depths = sorted({int(d) for lv in summary["levels"] for d in lv["by_depth"]})
    if depths:
        lines += [
            "",
            "## By turn depth",
            "",
            "Corrupt / completed turns at each turn depth (turn index within a session), with the rate.",
            "",
            "| turn depth | " + " | ".join(f"c{lv['concurrency']}" for lv in summary["levels"]) + " |",
            "|---:|" + "---:|" * len(summary["levels"]),
        ]
        for d in depths:
            cells = []
            for lv in summary["levels"]:
                at = lv["by_depth"].get(str(d))
                cells.append(f"{at['turns']['corrupt']}/{at['turns']['ok']} ({_pct(at['rate'])})" if at else "-")
            lines.append(f"| {d} | " + " | ".join(cells) + " |")
    with_slo = [lv for lv in summary["levels"] if lv.get("slo")]
    if with_slo:
        lines += [
            "",
            "## Goodput against the latency targets (--slo)",
            "",
            "Turns meeting every target (never a corrupt or failed one) over the level's batches, and the "
            "goodput over their windows added up (docs/slo.md).",
            "",
            "| concurrency | turns meeting the targets | share | good turns/s | good tokens/s |",
            "|---:|---:|---:|---:|---:|",
        ]
        for lv in with_slo:
            g = lv["slo"]
            per_s = [
                f"{x:.2f}" if x is not None else "-" for x in (g["goodput_turns_per_s"], g["goodput_tokens_per_s"])
            ]
            lines.append(
                f"| {lv['concurrency']} | {g['good']} of {g['turns']} | {_pct(g['share'])} | {per_s[0]} | {per_s[1]} |"
            )
    lines += ["", "## Runs", "", "Each batch is a run folder with its own report.md (`dsv4bench report RUN_DIR`).", ""]
    for lv in summary["levels"]:
        for run, verdict in zip(lv["runs"], lv["run_verdicts"]):
            lines.append(f"- c{lv['concurrency']}: {code_span(run, limit=500)} {verdict}")
    lines += ["", f"Command: {code_span(summary['command'], limit=2000)}", ""]
    return "\n".join(lines)


def _error_bars(rates: list[float], intervals: list[list[float]]) -> list[list[float]]:
    return [
        [100 * (r - lo) for r, (lo, _) in zip(rates, intervals)],
        [100 * (hi - r) for r, (_, hi) in zip(rates, intervals)],
    ]


def sweep_figure(summary: dict[str, Any]) -> Figure | None:
    """Rate with its interval against concurrency (left, the threshold marked), and against
    turn depth with one line per level (right). None when no level completed a turn."""
    levels = [lv for lv in summary["levels"] if lv["rate"] is not None]
    if not levels:
        return None
    from matplotlib.figure import Figure

    conf = f"{100 * summary['confidence']:g}%"
    fig = Figure(figsize=(12.0, 4.5), dpi=100, layout="constrained")
    by_level, by_depth = fig.subplots(1, 2)
    xs = [lv["concurrency"] for lv in levels]
    rates = [lv["rate"] for lv in levels]
    by_level.errorbar(
        xs,
        [100 * r for r in rates],
        yerr=_error_bars(rates, [lv["interval"] for lv in levels]),
        marker="o",
        capsize=4,
        color="#e15759",
        label=f"corrupt turns, {conf} Wilson interval",
    )
    if summary["baseline"]:
        by_level.axhline(100 * summary["baseline"], color="black", linestyle=":", linewidth=1, label="baseline")
    if summary["threshold"] is not None:
        by_level.axvline(
            summary["threshold"],
            color="black",
            linestyle="--",
            linewidth=1,
            label=f"threshold: c{summary['threshold']}",
        )
    if len(xs) > 2 and xs[-1] / xs[0] >= 8:  # 1, 8, 16, 32, 80 would crowd the left end on a linear axis
        by_level.set_xscale("log", base=2)
    by_level.set_xticks(xs, [str(x) for x in xs])
    by_level.set_xlabel("concurrency (sessions in flight)")
    by_level.set_ylabel("corrupt turns (% of completed)")
    by_level.set_title("Corruption rate by concurrency")
    by_level.set_ylim(bottom=0)
    by_level.grid(alpha=0.3)
    by_level.legend(fontsize="small")
    for i, lv in enumerate(levels):
        cells = [
            (int(d), at)
            for d, at in sorted(lv["by_depth"].items(), key=lambda kv: int(kv[0]))
            if at["rate"] is not None
        ]
        if not cells:
            continue
        depth_rates = [at["rate"] for _, at in cells]
        dodge = (i - (len(levels) - 1) / 2) * min(0.6 / len(levels), 0.12)  # the levels' bars side by side
        by_depth.errorbar(
            [d + dodge for d, _ in cells],
            [100 * r for r in depth_rates],
            yerr=_error_bars(depth_rates, [at["interval"] for _, at in cells]),
            marker=".",
            capsize=2,
            linewidth=1,
            label=f"c{lv['concurrency']}",
        )
    by_depth.set_xlabel("turn depth (turn index within a session)")
    by_depth.set_ylabel("corrupt turns (% of completed)")
    by_depth.set_title(f"By turn depth ({conf} intervals)")
    by_depth.set_ylim(bottom=0)
    by_depth.grid(alpha=0.3)
    by_depth.legend(fontsize="x-small", ncols=2)
    return fig


def write_sweep(sweep_dir: Path, summary: dict[str, Any]) -> list[Path]:
    """Write sweep.json, sweep.md and sweep.png into `sweep_dir`; the plot fails soft, as the
    run reports' plots do. Returns the files written."""
    from dsv4bench.history.run_folder import write_atomic, write_json_atomic

    write_json_atomic(sweep_dir / SWEEP_JSON, summary)
    write_atomic(sweep_dir / SWEEP_MD, sweep_markdown(summary).encode("utf-8", errors="backslashreplace"))
    written = [sweep_dir / SWEEP_JSON, sweep_dir / SWEEP_MD]
    try:
        fig = sweep_figure(summary)
        if fig is not None:
            fig.savefig(sweep_dir / SWEEP_PNG)
            written.append(sweep_dir / SWEEP_PNG)
    except Exception:  # a plot must never cost the sweep's findings
        log.warning("sweep plot failed; leaving it out", exc_info=True)
    return written
