"""`dsv4bench watch`: a live terminal view of the queue gauges, marking a wedge as it forms.

The incident (DESIGN §1) was visible only in hindsight: PD transfer/bootstrap queues sat at ~60
while nothing moved. This view shows each endpoint's queue gauges as sparklines and marks a
gauge red ("WEDGE?") once it has stayed > 0 for `stuck_s` seconds while no counter (`*_total`)
moved, the same "no progress" rule the post-run wedge detector (wedge.py) applies.

`WatchState` and `render_watch` are pure (fed monitor samples, see monitor.py) so they test on
literal series; `watch_main` is the thin scraping loop around them.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from .monitor import QUEUE_GAUGES, scrape_once
from .wedge import is_queue_gauge, metric_name

SPARK_CHARS = "▁▂▃▄▅▆▇█"
_NS = 1_000_000_000


def sparkline(values: list[float]) -> str:
    """One unicode block per value, scaled from 0 (or the minimum, if negative) to the maximum.

    Scaled from 0 rather than the series minimum: a queue flat at 58 should read as a full
    bar, not as an empty one, since "high and flat" is exactly what a wedge looks like.
    """
    if not values:
        return ""
    lo = min(0.0, min(values))
    hi = max(values)
    if hi <= lo:
        return SPARK_CHARS[0] * len(values)
    top = len(SPARK_CHARS) - 1
    return "".join(SPARK_CHARS[round((v - lo) / (hi - lo) * top)] for v in values)


def _gauge_sort_key(series: str) -> tuple[int, str]:
    name = metric_name(series)
    order = QUEUE_GAUGES.index(name) if name in QUEUE_GAUGES else len(QUEUE_GAUGES)
    return order, series


@dataclass
class _Endpoint:
    """What one endpoint has shown: recent values per gauge, and since when each stood still."""

    gauges: dict[str, deque[tuple[int, float]]] = field(default_factory=dict)
    counters: dict[str, float] | None = None
    # t_ns since which the counters have not changed (reset on every counter move).
    counters_still_since: int | None = None
    # t_ns since which each gauge has been > 0 and never decreased; absent while it is 0.
    held_since: dict[str, int] = field(default_factory=dict)
    last_ok: bool = False
    answered: bool = False
    last_t_ns: int | None = None
    error: str | None = None


class WatchState:
    """The last `history` samples per endpoint per queue gauge, and the stuck-gauge bookkeeping."""

    def __init__(self, stuck_s: float = 5.0, history: int = 40) -> None:
        self.stuck_s = stuck_s
        self.history = history
        self.endpoints: dict[str, _Endpoint] = {}

    def add(self, sample: dict[str, Any]) -> None:
        """Feed one monitor sample (`{"t_ns", "endpoint", "ok", "values"}`)."""
        ep = self.endpoints.setdefault(sample["endpoint"], _Endpoint())
        t = int(sample.get("t_ns", 0))
        ep.last_t_ns = t
        values = sample.get("values")
        if not sample.get("ok") or not isinstance(values, dict):
            # A failed scrape is no evidence either way: keep the clocks running, show the error.
            ep.last_ok, ep.error = False, sample.get("error") or "no answer"
            return
        ep.last_ok, ep.answered, ep.error = True, True, None
        counters = {k: v for k, v in values.items() if metric_name(k).endswith("_total")}
        if ep.counters is None or counters != ep.counters:
            ep.counters_still_since = t
        ep.counters = counters
        for key, value in values.items():
            if not is_queue_gauge(key):
                continue
            series = ep.gauges.setdefault(key, deque(maxlen=self.history))
            prev = series[-1][1] if series else None
            series.append((t, float(value)))
            if value <= 0 or (prev is not None and value < prev):
                # Zero, or shrinking: work is draining, so the stuck clock restarts.
                ep.held_since.pop(key, None)
                if value > 0:
                    ep.held_since[key] = t
            else:
                ep.held_since.setdefault(key, t)

    def wedge_forming(self, now_ns: int) -> dict[str, list[str]]:
        """{endpoint: [gauge series]} for gauges > 0, not shrinking, with counters frozen >= stuck_s."""
        out: dict[str, list[str]] = {}
        limit = int(self.stuck_s * _NS)
        for name, ep in self.endpoints.items():
            if ep.counters_still_since is None:
                continue
            stuck = []
            for key, since in ep.held_since.items():
                # Both clocks must have run for stuck_s: a held gauge with moving counters is busy.
                frozen_from = max(since, ep.counters_still_since)
                if now_ns - frozen_from >= limit:
                    stuck.append(key)
            if stuck:
                out[name] = sorted(stuck, key=_gauge_sort_key)
        return out

    @property
    def any_answered(self) -> bool:
        return any(ep.answered for ep in self.endpoints.values())

    def now_ns(self) -> int:
        """The latest sample time seen: the view judges "stuck" on the samples' own clock."""
        return max((ep.last_t_ns for ep in self.endpoints.values() if ep.last_t_ns is not None), default=0)


def render_watch(state: WatchState, now_ns: int | None = None) -> Group:
    """A table per run: endpoint, each queue gauge with its value and sparkline, WEDGE? marks."""
    now = state.now_ns() if now_ns is None else now_ns
    forming = state.wedge_forming(now)
    t = Table(title="dsv4bench watch: queue gauges", expand=False)
    for col in ("endpoint", "gauge", "now", "recent", "state"):
        t.add_column(col, no_wrap=col != "endpoint")
    for name, ep in state.endpoints.items():
        if not ep.gauges:
            t.add_row(name, "–", "–", "", Text(ep.error or "no queue gauges", style="yellow"))
            continue
        for i, key in enumerate(sorted(ep.gauges, key=_gauge_sort_key)):
            values = [v for _, v in ep.gauges[key]]
            if key in forming.get(name, []):
                mark = Text(f"WEDGE? {metric_name(key)}", style="bold red")
            elif not ep.last_ok:
                mark = Text(f"scrape failed: {ep.error}"[:60], style="yellow")
            else:
                mark = Text("")
            style = "red" if values[-1] > 0 and key in forming.get(name, []) else ""
            t.add_row(name if i == 0 else "", key, Text(f"{values[-1]:g}", style=style), sparkline(values), mark)
    n = sum(len(v) for v in forming.values())
    foot = (Text(f"{n} gauge(s) stuck with no counter moving for >= {state.stuck_s:g} s", style="bold red")
            if n else Text("no wedge forming", style="green"))
    return Group(t, foot)


async def watch_main(metrics_urls: list[str], duration: float, interval: float, stuck_s: float,
                     console: Console | None = None) -> int:
    """Scrape every URL each `interval` s for `duration` s under a live view.

    Returns 1 if a wedge was marked at the end, 0 if not, 2 if no endpoint ever answered.
    """
    console = console or Console(stderr=True)
    state = WatchState(stuck_s=stuck_s)
    deadline = time.monotonic() + duration
    async with httpx.AsyncClient(trust_env=False) as client:
        with Live(render_watch(state), console=console, refresh_per_second=4, transient=False) as live:
            while True:
                t0 = time.monotonic()
                samples: list[dict[str, Any]] = []

                async def one(url: str) -> None:
                    samples.append(await scrape_once(client, url, timeout=max(interval, 0.5)))

                async with anyio.create_task_group() as tg:
                    for url in metrics_urls:
                        tg.start_soon(one, url)
                for s in sorted(samples, key=lambda s: s["t_ns"]):
                    state.add(s)
                live.update(render_watch(state))
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                await anyio.sleep(min(left, max(0.0, interval - (time.monotonic() - t0))))
    if not state.any_answered:
        return 2
    # Judged at "now", not at the last sample: a gauge held through the final sleep counts too.
    return 1 if state.wedge_forming(time.monotonic_ns()) else 0
