"""PNG plots for the report: a turn timeline by outcome, and corruption rate by turn depth.

Built on `matplotlib.figure.Figure` directly rather than pyplot: no global figure registry and
no backend switch (Figure.savefig renders PNG through Agg by itself), so it never opens a
display and is safe to call from a thread at the end of a run. Fail soft: a plot that cannot
be drawn is logged and left out; the report is worth more than any one picture.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from ..history import History
from ..records import TurnRecord, TurnStatus
from ..summary import outcome_counts, run_window, turn_end_wall_ns

log = logging.getLogger(__name__)

PLOTS_DIR = "plots"
FIGSIZE = (9.0, 4.0)
DPI = 100
MAX_BINS = 120  # beyond this the timeline's bars get wider rather than thinner
MAX_BAR_LABELS = 24  # annotate "corrupt/ok" above bars only while they stay legible
OUTCOME_COLORS = {"ok, clean": "#59a14f", "corrupt": "#e15759", "killed": "#9d9d9d", "error / timeout": "#f28e2b"}


def outcome(turn: TurnRecord) -> str:
    """The timeline category of a turn."""
    if turn.status is TurnStatus.KILLED:
        return "killed"
    if turn.status is not TurnStatus.OK:
        return "error / timeout"
    return "corrupt" if turn.corrupt else "ok, clean"


def is_kill_event(event: dict[str, Any]) -> bool:
    """Nemesis events, drawn as vertical lines: kinds named kill* or nemesis*."""
    kind = str(event.get("kind", ""))
    return kind.startswith("kill") or kind.startswith("nemesis")


def timeline_figure(history: History) -> Figure | None:
    """Turns completed per second, stacked by outcome, corrupt turns and kills marked."""
    start, end = run_window(history)
    if not history.turns or start is None or end is None:
        return None
    ends = [(turn_end_wall_ns(t) - start) / 1e9 for t in history.turns]
    span = max(max(ends), (end - start) / 1e9, 1.0)
    width = max(1, math.ceil(span / MAX_BINS))  # seconds per bar, whole seconds
    nbins = math.ceil(span / width) + 1
    per_bin = {name: [0] * nbins for name in OUTCOME_COLORS}
    for t, x in zip(history.turns, ends):
        per_bin[outcome(t)][min(max(int(x // width), 0), nbins - 1)] += 1

    fig = Figure(figsize=FIGSIZE, dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    lefts = [i * width for i in range(nbins)]
    bottom = [0.0] * nbins
    for name, color in OUTCOME_COLORS.items():
        heights = [n / width for n in per_bin[name]]
        if any(heights):
            ax.bar(lefts, heights, width=width, bottom=bottom, align="edge", color=color, label=name, linewidth=0)
            bottom = [b + h for b, h in zip(bottom, heights)]
    corrupt_x = [x for t, x in zip(history.turns, ends) if t.corrupt]
    if corrupt_x:
        # x in data, y in axes fraction: a rug of markers along the top, one per corrupt turn.
        ax.scatter(corrupt_x, [0.97] * len(corrupt_x), marker="v", s=30, color=OUTCOME_COLORS["corrupt"],
                   edgecolors="black", linewidths=0.4, transform=ax.get_xaxis_transform(), label="corrupt turn",
                   zorder=3, clip_on=False)
    kills = [(e["t_wall_ns"] - start) / 1e9 for e in history.events
             if is_kill_event(e) and isinstance(e.get("t_wall_ns"), int)]
    for i, x in enumerate(kills):
        ax.axvline(x, color="black", linestyle="--", linewidth=1, label="nemesis kill" if i == 0 else None)
    ax.set_xlim(0, nbins * width)
    ax.set_ylim(0, max(max(bottom), 1e-9) * 1.15)
    ax.set_xlabel("seconds since run start")
    ax.set_ylabel("turns completed / s" if width == 1 else f"turns completed / s ({width} s bins)")
    ax.set_title(f"Turns by outcome over time ({len(history.turns):,} turns)")
    # Outside the axes: inside, it would hide the corrupt-turn markers along the top.
    fig.legend(loc="outside lower center", fontsize="small", ncols=6, frameon=False)
    ax.grid(axis="y", alpha=0.3)
    return fig


def depth_figure(history: History) -> Figure | None:
    """Corruption rate (% of completed turns) by turn depth, with the turn counts behind it."""
    if not history.turns:
        return None
    depths = sorted({t.turn for t in history.turns})
    groups = {d: outcome_counts([t for t in history.turns if t.turn == d]) for d in depths}
    rates = [100.0 * g["corrupt"] / g["ok"] if g["ok"] else 0.0 for g in groups.values()]

    fig = Figure(figsize=FIGSIZE, dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    # The turn counts go on a twin axis drawn underneath, so a 100% bar over 2 turns reads as noise.
    counts_ax = ax.twinx()
    counts_ax.plot(depths, [g["ok"] for g in groups.values()], color="#4e79a7", marker=".", linewidth=1,
                   label="completed turns (right axis)")
    counts_ax.set_ylabel("completed turns")
    counts_ax.set_ylim(0, max(max(g["ok"] for g in groups.values()), 1) * 1.2)
    ax.set_zorder(counts_ax.get_zorder() + 1)
    ax.patch.set_visible(False)
    bars = ax.bar(depths, rates, width=0.7, color=OUTCOME_COLORS["corrupt"], label="corrupt / completed")
    if len(depths) <= MAX_BAR_LABELS:
        labels = [f"{g['corrupt']}/{g['ok']}" for g in groups.values()]
        ax.bar_label(bars, labels=labels, fontsize="x-small", padding=2)
    ax.set_ylim(0, max(max(rates), 1.0) * 1.2)
    ax.set_xlabel("turn depth (turn index within a session)")
    ax.set_ylabel("corrupt turns (% of completed)")
    ax.set_title("Corruption rate by turn depth")
    if len(depths) <= MAX_BAR_LABELS:
        ax.set_xticks(depths)
    handles = [*ax.get_legend_handles_labels()[0], *counts_ax.get_legend_handles_labels()[0]]
    fig.legend(handles=handles, loc="outside lower center", fontsize="small", ncols=2, frameon=False)
    ax.grid(axis="y", alpha=0.3)
    return fig


PLOTS: dict[str, Callable[[History], Figure | None]] = {
    "timeline.png": timeline_figure,
    "corruption_by_depth.png": depth_figure,
}


def render_plots(history: History, out_dir: Path) -> list[str]:
    """Write the plots into out_dir/plots; returns their paths relative to out_dir. Never raises."""
    written: list[str] = []
    for name, draw in PLOTS.items():
        try:
            fig = draw(history)
            if fig is None:
                continue
            (Path(out_dir) / PLOTS_DIR).mkdir(parents=True, exist_ok=True)
            fig.savefig(Path(out_dir) / PLOTS_DIR / name)
            written.append(f"{PLOTS_DIR}/{name}")
        except Exception:  # noqa: BLE001 - a plot must never cost the report
            log.warning("plot %s failed; leaving it out of the report", name, exc_info=True)
    return written
