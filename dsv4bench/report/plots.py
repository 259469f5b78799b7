"""PNG plots for the report: a turn timeline by outcome (kills and the first finding of each code
marked), corruption rate by turn depth, a queue timeline (active sessions over every scraped
queue gauge, kills as shaded bands), and each server's KV cache against its pool (evictions and
loads back from the host tier beside it).

Built on `matplotlib.figure.Figure` directly rather than pyplot: no global figure registry and
no backend switch (Figure.savefig renders PNG through Agg by itself), so it never opens a
display and is safe to call from a thread at the end of a run. Fail soft: a plot that cannot
be drawn is logged and left out; the report is worth more than any one picture.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from dsv4bench.servers.cache_pressure import CachePressure, cache_pressure
from dsv4bench.servers.dialect import QUEUE_GAUGES, RUNNING, current_name, is_queue_gauge, metric_name
from dsv4bench.history.run_folder import History, open_private, private_dir
from dsv4bench.history.records import TurnRecord, TurnStatus
from dsv4bench.report.onset import first_turns
from dsv4bench.report.counting import outcome_counts, run_window, turn_end_wall_ns
from dsv4bench.report.escape import plot_text

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


def first_finding_marks(history: History, start_wall_ns: int) -> list[tuple[float, str]]:
    """(seconds since `start_wall_ns`, code) of the first finding of each code (onset.py), first
    found first: the timeline marks them beside the kills."""
    return [((at - start_wall_ns) / 1e9, code) for code, (at, _, _) in first_turns(history).items()]


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
        ax.scatter(
            corrupt_x,
            [0.97] * len(corrupt_x),
            marker="v",
            s=30,
            color=OUTCOME_COLORS["corrupt"],
            edgecolors="black",
            linewidths=0.4,
            transform=ax.get_xaxis_transform(),
            label="corrupt turn",
            zorder=3,
            clip_on=False,
        )
    kills = [
        (e["t_wall_ns"] - start) / 1e9
        for e in history.events
        if is_kill_event(e) and isinstance(e.get("t_wall_ns"), int)
    ]
    for i, x in enumerate(kills):
        ax.axvline(x, color="black", linestyle="--", linewidth=1, label="nemesis kill" if i == 0 else None)
    for i, (x, code) in enumerate(first_finding_marks(history, start)):
        ax.axvline(
            x, color="#b07aa1", linestyle=":", linewidth=1.2, label="first finding of a code" if i == 0 else None
        )
        # The code's name up the line, from the bottom: the corrupt-turn rug runs along the top.
        ax.text(
            x,
            0.02,
            f" {plot_text(code)}",
            rotation=90,
            fontsize="x-small",
            color="#b07aa1",
            transform=ax.get_xaxis_transform(),
            va="bottom",
            ha="right",
        )
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
    by_depth: dict[int, list[TurnRecord]] = {}
    for t in history.turns:  # one pass: a proxy's turns may have as many depths as sessions
        by_depth.setdefault(t.turn, []).append(t)
    depths = sorted(by_depth)
    groups = {d: outcome_counts(by_depth[d]) for d in depths}
    rates = [100.0 * g["corrupt"] / g["ok"] if g["ok"] else 0.0 for g in groups.values()]

    fig = Figure(figsize=FIGSIZE, dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    # The turn counts go on a twin axis drawn underneath, so a 100% bar over 2 turns reads as noise.
    counts_ax = ax.twinx()
    counts_ax.plot(
        depths,
        [g["ok"] for g in groups.values()],
        color="#4e79a7",
        marker=".",
        linewidth=1,
        label="completed turns (right axis)",
    )
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


KILL_BAND_S = 0.5  # the shortest band drawn for a kill, so one stays visible on a long run


def _run_start_ns(history: History) -> int | None:
    """Monotonic ns of the run start: run_start's t_ns, else the earliest t_ns recorded."""
    starts = [e["t_ns"] for e in history.events if e.get("kind") == "run_start" and isinstance(e.get("t_ns"), int)]
    if starts:
        return min(starts)
    seen = [e["t_ns"] for e in history.events if isinstance(e.get("t_ns"), int)]
    seen += [m["t_ns"] for m in history.metrics if isinstance(m.get("t_ns"), int)]
    return min(seen) if seen else None


def active_sessions(history: History, t0: int) -> tuple[list[float], list[int]]:
    """A step series of sessions open over time, from session_start/session_end events."""
    deltas = sorted(
        ((e["t_ns"] - t0) / 1e9, 1 if e["kind"] == "session_start" else -1)
        for e in history.events
        if e.get("kind") in ("session_start", "session_end") and isinstance(e.get("t_ns"), int)
    )
    xs, ys, n = [0.0], [0], 0
    for x, d in deltas:
        n = max(0, n + d)  # a session_end without its start (torn history) must not go negative
        xs.append(x)
        ys.append(n)
    return xs, ys


def queue_series(history: History, t0: int) -> dict[str, tuple[list[float], list[float]]]:
    """{"gauge @ endpoint": (xs, ys)} for gauges ever > 0 plus running gauges, in display order."""
    series: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
    for m in sorted(history.metrics, key=lambda m: m.get("t_ns", 0)):
        if not m.get("ok") or not isinstance(m.get("values"), dict) or not isinstance(m.get("t_ns"), int):
            continue
        for key, value in m["values"].items():
            if is_queue_gauge(key):
                xs, ys = series.setdefault((str(m.get("endpoint")), key), ([], []))
                xs.append((m["t_ns"] - t0) / 1e9)
                ys.append(float(value))
    # Running is always shown (it is the baseline load); other gauges only if they ever rose,
    # else a PD deployment's eight flat zeros per endpoint drown the one that matters.
    keep = {k: v for k, v in series.items() if metric_name(k[1]) in RUNNING or any(y > 0 for y in v[1])}

    def order(k: tuple[str, str]) -> tuple[str, int, str]:
        name = current_name(metric_name(k[1]))  # an older release's name sorts with its current one
        return k[0], QUEUE_GAUGES.index(name) if name in QUEUE_GAUGES else 99, k[1]

    # Gauge names and endpoints are the server's and the user's text: plot_text keeps them labels.
    return {plot_text(f"{metric_name(g).split(':', 1)[-1]} @ {ep}"): keep[(ep, g)] for ep, g in sorted(keep, key=order)}


def queue_timeline_figure(history: History) -> Figure | None:
    """Active sessions (top) over every queue gauge per endpoint (bottom); kills shaded, like
    Jepsen's perf plots, and load_stopped / drain_end as vertical lines. None without metrics."""
    t0 = _run_start_ns(history)
    if t0 is None:
        return None
    queues = queue_series(history, t0)
    if not queues:
        return None
    fig = Figure(figsize=(FIGSIZE[0], 6.5), dpi=DPI, layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[1, 2.2])
    xs, ys = active_sessions(history, t0)
    top.step(xs, ys, where="post", color="#4e79a7", linewidth=1.2)
    top.set_ylabel("active sessions")
    top.set_title("Sessions and server queues over time")
    for label, (qx, qy) in queues.items():
        bottom.plot(qx, qy, linewidth=1.1, marker="." if len(qx) < 60 else None, markersize=3, label=label)
    bottom.set_ylabel("requests in gauge")
    bottom.set_xlabel("seconds since run start (monotonic)")
    sample_xs = sorted({x for qx, _ in queues.values() for x in qx})
    kills = sorted(
        (e["t_ns"] - t0) / 1e9 for e in history.events if is_kill_event(e) and isinstance(e.get("t_ns"), int)
    )
    for i, k in enumerate(kills):
        # A band until the next scrape (what the gauges could first show of it), at least 0.5 s.
        nxt = next((x for x in sample_xs if x > k), k + KILL_BAND_S)
        for ax in (top, bottom):
            ax.axvspan(
                k,
                max(nxt, k + KILL_BAND_S),
                color="#e15759",
                alpha=0.25,
                linewidth=0,
                label="nemesis kill" if i == 0 and ax is bottom else None,
            )
    marks = {"load_stopped": ("black", "--"), "drain_end": ("#59a14f", ":")}
    for kind, (color, style) in marks.items():
        for i, e in enumerate(e for e in history.events if e.get("kind") == kind and isinstance(e.get("t_ns"), int)):
            for ax in (top, bottom):
                ax.axvline(
                    (e["t_ns"] - t0) / 1e9,
                    color=color,
                    linestyle=style,
                    linewidth=1,
                    label=kind.replace("_", " ") if i == 0 and ax is bottom else None,
                )
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    fig.legend(
        *bottom.get_legend_handles_labels(), loc="outside lower center", fontsize="x-small", ncols=3, frameon=False
    )
    return fig


MAX_CACHE_PANELS = 4  # servers drawn, one panel each; summary.json has every one


def _first_scrape_ns(history: History) -> dict[str, int]:
    """Each endpoint's first good scrape, on the monotonic clock: where its cache timeline's zero is
    (cache_pressure.py counts a timeline's seconds from it)."""
    first: dict[str, int] = {}
    for m in history.metrics:
        endpoint, t = m.get("endpoint"), m.get("t_ns")
        if m.get("ok") is True and isinstance(m.get("values"), dict) and isinstance(endpoint, str):
            if isinstance(t, int) and not isinstance(t, bool):
                first[endpoint] = min(first.get(endpoint, t), t)
    return first


def _has_timeline(p: CachePressure) -> bool:
    return any(kv is not None or ev is not None or lb is not None for _, kv, ev, lb in p.timeline)


def kv_cache_figure(history: History) -> Figure | None:
    """Per server: device KV used over time against its pool (a horizontal line), and on a second
    axis the tokens evicted from the device pool and loaded back from the host tier so far. None
    where no server gave a timeline."""
    servers = [p for p in cache_pressure(history.metrics).values() if _has_timeline(p)][:MAX_CACHE_PANELS]
    if not servers:
        return None
    t0, first = _run_start_ns(history), _first_scrape_ns(history)
    fig = Figure(figsize=(FIGSIZE[0], 1.0 + 2.6 * len(servers)), dpi=DPI, layout="constrained")
    axes = fig.subplots(len(servers), 1, sharex=True, squeeze=False)[:, 0]
    for ax, p in zip(axes, servers):
        # The timeline's seconds are since this endpoint's first scrape: moved onto the run's axis.
        shift = (first[p.endpoint] - t0) / 1e9 if t0 is not None and p.endpoint in first else 0.0
        xs = [t + shift for t, *_ in p.timeline]
        used = [kv for _, kv, _, _ in p.timeline]
        if any(v is not None for v in used):
            ax.plot(xs, [math.nan if v is None else v for v in used], color="#4e79a7", linewidth=1.2, label="KV used")
        if p.kv_total_tokens is not None:
            ax.axhline(p.kv_total_tokens, color="black", linestyle="--", linewidth=1, label="device pool")
        ax.set_ylabel("device KV tokens")
        ax.set_ylim(bottom=0)
        ax.set_title(plot_text(p.endpoint), fontsize="small")
        ax.grid(alpha=0.3)
        moved = ax.twinx()
        top = 0.0
        for column, label, color in ((2, "evicted so far", "#e15759"), (3, "loaded back from host so far", "#f28e2b")):
            ys = [point[column] for point in p.timeline]
            if any(y is not None for y in ys):
                moved.step(xs, [math.nan if y is None else y for y in ys], where="post", color=color, label=label)
                top = max(top, *(y for y in ys if y is not None))
        moved.set_ylabel("tokens so far")
        moved.set_ylim(0, max(top * 1.1, 1.0))  # whole tokens: a flat zero sits on the axis, not at 0.05
    axes[-1].set_xlabel("seconds since run start (monotonic)")
    fig.suptitle("Device KV cache against its pool")
    handles, labels = [], []
    for ax in fig.axes:  # each label once, whichever panel drew it first
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="outside lower center", fontsize="x-small", ncols=4, frameon=False)
    return fig


PLOTS: dict[str, Callable[[History], Figure | None]] = {
    "timeline.png": timeline_figure,
    "corruption_by_depth.png": depth_figure,
    "timeline_queues.png": queue_timeline_figure,
    "kv_cache.png": kv_cache_figure,
}


def render_plots(history: History, out_dir: Path) -> list[str]:
    """Write the plots into out_dir/plots; returns their paths relative to out_dir. Never raises."""
    written: list[str] = []
    for name, draw in PLOTS.items():
        try:
            fig = draw(history)
            if fig is None:
                continue
            private_dir(Path(out_dir) / PLOTS_DIR)  # private as the run folder that holds it
            with os.fdopen(open_private(Path(out_dir) / PLOTS_DIR / name, os.O_WRONLY | os.O_TRUNC), "wb") as f:
                fig.savefig(f, format="png")
            written.append(f"{PLOTS_DIR}/{name}")
        except Exception:  # a plot must never cost the report
            log.warning("plot %s failed; leaving it out of the report", name, exc_info=True)
    return written
