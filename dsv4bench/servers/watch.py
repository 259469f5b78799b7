"""`dsv4bench watch`: a live terminal view of the queue gauges, marking a wedge as it forms.

The wedge incident (an 80-session agent killed mid-flight) was visible only in hindsight: PD
transfer/bootstrap queues sat at ~60 while nothing moved. This view shows each endpoint
(host:port and its role, see roles.py) with only the gauges its role has (and any other that
holds requests), labels collapsed (summed over ranks), each with its current value beside its
sparkline, and the endpoint's state in words:
"idle", "busy", "draining", "stuck 3 s", or "WEDGE: decode transfer queue stuck at 40 for 20 s"
once a gauge has stayed > 0 without shrinking for `stuck_s` seconds while no counter (`*_total`)
moved, the same "no progress" rule the post-run wedge detector (wedge.py) applies. It fits an
80-column terminal.

A server whose kind offers no gauges (a plain OpenAI-compatible server's /metrics answers 404;
TensorRT-LLM's answers `[]` while no iteration runs) shows "gauges not offered": it is judged by
its canaries and /health alone (`probe`), and the view never flags a wedge from gauges it does
not have. A kind that has gauges and whose scrape fails shows "scrape failed" (servers/kinds.py).
Each endpoint is scraped on its own clock with its kind's timeout: TensorRT-LLM's /metrics holds
the request up to 2 s, and delays no other endpoint's view.

`WatchState` and `render_watch` are pure (fed monitor samples, see monitor.py) so they test on
literal series; `watch_main` is the thin scraping loop around them.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from dsv4bench.servers.dialect import (
    QUEUE_GAUGES,
    RUNNING,
    WAITING,
    counters,
    current_name,
    is_queue_gauge,
    metric_name,
)
from dsv4bench.servers.monitor import MetricSample, kind_of_sample, scrape_once
from dsv4bench.servers.roles import (
    GAUGE_LABELS,
    GAUGE_WORDS,
    Role,
    discover_role,
    own_gauges_shown,
    part_labels,
    role_from_metrics,
    role_gauges,
)
from dsv4bench.servers.kinds import METRICS, Kind, kind, not_offered, scrape_timeout
from dsv4bench.terminal import visible_text

SPARK_CHARS = "▁▂▃▄▅▆▇█"
_NS = 1_000_000_000
_FRONT_GAUGES = frozenset({*RUNNING, *WAITING})
_LABEL_W = 11  # "  bootstrap": the longest label and its indent
_VALUE_W = 6


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
    # An older release's name sorts with its current one.
    name = current_name(metric_name(series))
    order = QUEUE_GAUGES.index(name) if name in QUEUE_GAUGES else len(QUEUE_GAUGES)
    return order, series


@dataclass
class _Endpoint:
    """What one endpoint has shown: recent values per gauge, and since when each stood still."""

    gauges: dict[str, deque[tuple[int, float]]] = field(default_factory=dict)  # series -> (t_ns, value)
    sums: dict[str, deque[float]] = field(default_factory=dict)  # gauge name -> its series summed, per sample
    counters: dict[str, float] | None = None
    # t_ns since which the counters have not changed (reset on every counter move).
    counters_still_since: int | None = None
    # t_ns since which each gauge has been > 0 and never decreased; absent while it is 0.
    held_since: dict[str, int] = field(default_factory=dict)
    in_flight: float = 0.0  # every queue gauge summed, at the last sample
    shrank: bool = False  # the work in flight shrank at the last sample
    counters_moved: bool = False  # a counter moved at the last sample
    role: Role = field(default_factory=Role)
    last_ok: bool = False
    answered: bool = False
    last_t_ns: int | None = None
    error: str | None = None
    kind: Kind | None = None  # the kind its answers showed; kept once seen
    # Why its last answer held no gauges though the server answered as its kind does (None: it
    # held gauges, or failed).
    not_offered: str | None = None


class WatchState:
    """The last `history` samples per endpoint per queue gauge, and the stuck-gauge bookkeeping."""

    def __init__(self, stuck_s: float = 5.0, history: int = 40) -> None:
        self.stuck_s = stuck_s
        self.history = history
        self.endpoints: dict[str, _Endpoint] = {}

    def set_role(self, endpoint: str, role: Role) -> None:
        """The role the server stated; a role read from its metrics labels never replaces it."""
        if role.known:
            self.endpoints.setdefault(endpoint, _Endpoint()).role = role

    def add(self, sample: MetricSample) -> None:
        """Feed one monitor sample."""
        ep = self.endpoints.setdefault(sample.endpoint, _Endpoint())
        t = sample.t_ns
        ep.last_t_ns = t
        values = sample.values
        ep.kind = kind_of_sample(sample) or ep.kind
        if not sample.ok or values is None:
            why = self._gauges_not_offered(ep, sample)
            if why is not None:
                # An answer with no gauges in it: nothing to judge, so no clock runs on the gauges
                # seen before (a wedge is never flagged from gauges the server does not give).
                ep.last_ok, ep.answered, ep.error, ep.not_offered = True, True, None, why
                ep.held_since.clear()
                ep.counters, ep.counters_still_since, ep.in_flight, ep.shrank = None, None, 0.0, False
                return
            # A failed scrape is no evidence either way: keep the clocks running, show the error.
            ep.last_ok, ep.error = False, sample.error or "no answer"
            return
        ep.last_ok, ep.answered, ep.error, ep.not_offered = True, True, None, None
        if not ep.role.known:
            ep.role = role_from_metrics(values) or ep.role
        now_counters = counters(values)
        ep.counters_moved = ep.counters is not None and now_counters != ep.counters
        if ep.counters is None or now_counters != ep.counters:
            ep.counters_still_since = t
        ep.counters = now_counters
        sums: dict[str, float] = {}
        for key, value in values.items():
            if not is_queue_gauge(key):
                continue
            sums[metric_name(key)] = sums.get(metric_name(key), 0.0) + float(value)
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
        for name, total in sums.items():
            ep.sums.setdefault(name, deque(maxlen=self.history)).append(total)
        in_flight = sum(sums.values())
        ep.shrank, ep.in_flight = in_flight < ep.in_flight, in_flight

    @staticmethod
    def _gauges_not_offered(ep: _Endpoint, sample: MetricSample) -> str | None:
        """Why a scrape that got no gauges is no failure: TensorRT-LLM's empty list of iteration
        stats, or a 404, 405 or 501 on /metrics from a server whose kind may lack it."""
        if sample.no_iteration:
            return "no iteration since the last look"
        if sample.status is not None and not_offered(ep.kind or kind(None), METRICS, sample.status):
            return f"/metrics HTTP {sample.status}"
        return None

    def _frozen_for(self, ep: _Endpoint, key: str, now_ns: int) -> float:
        """Seconds the gauge `key` has held without shrinking while no counter moved."""
        since = ep.held_since.get(key)
        if since is None or ep.counters_still_since is None:
            return 0.0
        # Both clocks must have run: a held gauge with moving counters is busy.
        return max(0.0, (now_ns - max(since, ep.counters_still_since)) / _NS)

    def wedge_forming(self, now_ns: int) -> dict[str, list[str]]:
        """{endpoint: [gauge series]} for gauges > 0, not shrinking, with counters frozen >= stuck_s."""
        out: dict[str, list[str]] = {}
        for name, ep in self.endpoints.items():
            stuck = [key for key in ep.held_since if self._frozen_for(ep, key, now_ns) >= self.stuck_s]
            if stuck:
                out[name] = sorted(stuck, key=_gauge_sort_key)
        return out

    def shown_gauges(self, endpoint: str) -> list[str]:
        """The gauge names to show: the role's that the server exports, then any other that has
        held requests in the window (a gauge a role should not have but that holds work shows)."""
        ep = self.endpoints[endpoint]
        own = role_gauges(ep.role.name)
        others = sorted(
            (g for g, vals in ep.sums.items() if g not in own and any(v > 0 for v in vals)), key=_gauge_sort_key
        )
        return own_gauges_shown(ep.role.name, ep.sums) + others

    def describe(self, endpoint: str, now_ns: int) -> Text:
        """The endpoint's state in words."""
        ep = self.endpoints[endpoint]
        stuck = self.wedge_forming(now_ns).get(endpoint, [])
        if stuck:
            # Named by gauge, summed over its series; the longest held names the wedge, and among
            # equals a PD queue before waiting and running.
            ordered = sorted(stuck, key=lambda k: (metric_name(k) in _FRONT_GAUGES, _gauge_sort_key(k)))
            key = max(ordered, key=lambda k: self._frozen_for(ep, k, now_ns))
            name = metric_name(key)
            value = ep.sums[name][-1] if ep.sums.get(name) else ep.gauges[key][-1][1]
            words = (
                f"WEDGE: {self._gauge_words(ep, key)} stuck at {value:g} "
                f"for {self._frozen_for(ep, key, now_ns):.0f} s{self._ranks(ep, key, stuck)}"
            )
            others = {metric_name(k) for k in stuck} - {name}
            if others:
                words += f" (+{len(others)} more)"
            return Text(words, style="bold red")
        if ep.not_offered is not None:
            return Text(f"gauges not offered ({ep.not_offered}): judged by canaries and /health alone", style="dim")
        if not ep.answered:
            return Text(f"no answer: {ep.error or 'not scraped yet'}"[:120], style="yellow")
        if not ep.last_ok:
            return Text(f"scrape failed: {ep.error}"[:120], style="yellow")
        if ep.in_flight <= 0:
            return Text("idle", style="green")
        if ep.shrank:
            return Text("draining", style="cyan")
        held = [self._frozen_for(ep, k, now_ns) for k in ep.held_since]
        if ep.counters_moved or not held or max(held) <= 0:
            return Text("busy", style="green")
        return Text(f"stuck {max(held):.0f} s", style="yellow")

    @staticmethod
    def _gauge_words(ep: _Endpoint, key: str) -> str:
        name = metric_name(key)
        role = f"{ep.role.name} " if ep.role.known else ""
        return f"{role}{GAUGE_WORDS.get(name, name)}"

    @staticmethod
    def _ranks(ep: _Endpoint, key: str, stuck: list[str]) -> str:
        """` (tp_rank=0)`: the stuck series of the gauge, only where others of it are not stuck."""
        name = metric_name(key)
        series = [k for k in ep.gauges if metric_name(k) == name]
        held = [k for k in series if k in stuck]
        if len(held) < len(series) and all(part_labels(k) for k in held):
            return f" ({'; '.join(part_labels(k) for k in held)})"
        return ""

    @property
    def any_answered(self) -> bool:
        return any(ep.answered for ep in self.endpoints.values())

    def now_ns(self) -> int:
        """The latest sample time seen: the view judges "stuck" on the samples' own clock."""
        return max((ep.last_t_ns for ep in self.endpoints.values() if ep.last_t_ns is not None), default=0)


def endpoint_label(url: str) -> str:
    """http://10.0.0.1:30000/metrics -> 10.0.0.1:30000 (a path other than /metrics is kept)."""
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    return parts.netloc + ("" if path in ("", "/metrics") else path) if parts.netloc else url


def render_watch(state: WatchState, now_ns: int | None = None, width: int = 80) -> Group:
    """Per endpoint: `host:port  role  state`, then one line per gauge: label, value, sparkline."""
    now = state.now_ns() if now_ns is None else now_ns
    forming = state.wedge_forming(now)
    spark_w = max(8, min(state.history, width - _LABEL_W - _VALUE_W - 4))
    labels = {name: endpoint_label(name) for name in state.endpoints}
    name_w = min(max((len(v) for v in labels.values()), default=10), max(10, width // 3))
    parts: list[Any] = [
        Text(
            f"dsv4bench watch · {len(state.endpoints)} endpoint(s) · WEDGE after {state.stuck_s:g} s with no progress",
            style="bold",
        )
    ]
    for name, ep in state.endpoints.items():
        head = Table.grid(padding=(0, 1))
        head.add_column(no_wrap=True, width=name_w, overflow="ellipsis")
        head.add_column(no_wrap=True, width=7)
        head.add_column(overflow="fold")
        # The endpoint's state quotes what it said (errors, labels of stuck series), and a gauge's
        # label is the server's own metric name: each goes through visible_text before it prints.
        head.add_row(
            visible_text(Text(labels[name], style="bold")),
            visible_text(Text(ep.role.name)),
            visible_text(state.describe(name, now)),
        )
        parts.append(head)
        shown = state.shown_gauges(name) if ep.sums else []
        if not shown:
            empty = "  gauges not offered" if ep.not_offered is not None else "  no queue gauges"
            parts.append(Text(empty if ep.answered else "  –", style="dim"))
            continue
        rows = Table.grid(padding=(0, 1))
        rows.add_column(no_wrap=True, width=_LABEL_W, overflow="ellipsis")
        rows.add_column(no_wrap=True, justify="right", width=_VALUE_W, overflow="ellipsis")
        rows.add_column(no_wrap=True, overflow="crop", max_width=spark_w)
        stuck_names = {metric_name(k) for k in forming.get(name, [])}
        for g in shown:
            values = list(ep.sums[g])[-spark_w:]
            style = "bold red" if g in stuck_names else ""
            label = GAUGE_LABELS.get(g, g.split(":", 1)[-1])
            rows.add_row(
                visible_text(Text(f"  {label}")),
                Text(f"{values[-1]:g}", style=style),
                Text(sparkline(values), style=style),
            )
        parts.append(rows)
    n = sum(len(v) for v in forming.values())
    parts.append(
        Text(f"WEDGE forming: {n} gauge(s) held with no counter moving for >= {state.stuck_s:g} s", style="bold red")
        if n
        else Text("no wedge forming", style="green")
    )
    return Group(*parts)


def _root(metrics_url: str) -> str:
    base = metrics_url.rstrip("/")
    return base[: -len("/metrics")] if base.endswith("/metrics") else base


async def watch_main(
    metrics_urls: list[str],
    duration: float,
    interval: float,
    stuck_s: float,
    console: Console | None = None,
    api_key: str | None = None,
) -> int:
    """Scrape every URL each `interval` s for `duration` s under a live view.

    Returns 1 if a wedge was marked at the end, 0 if not, 2 if no endpoint ever answered.
    """
    console = console or Console(stderr=True)
    state = WatchState(stuck_s=stuck_s)
    for url in metrics_urls:
        state.endpoints.setdefault(url, _Endpoint())
    deadline = time.monotonic() + duration
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def view() -> Group:
        return render_watch(state, width=console.width)

    async with httpx.AsyncClient(trust_env=False, headers=headers) as client:

        async def role_of(url: str) -> None:
            # Asked once: /get_server_info states it; the metrics labels fill in where it does not.
            state.set_role(url, await discover_role(client, _root(url), timeout=min(2.0, max(interval, 0.5))))

        with Live(view(), console=console, refresh_per_second=4, transient=False) as live:

            async def scrape_loop(url: str) -> None:
                # Its own clock: a scrape its kind lets take longer holds up no other endpoint.
                known: Kind | None = None
                while True:
                    t0 = time.monotonic()
                    sample = await scrape_once(client, url, timeout=scrape_timeout(known, interval))
                    known = kind_of_sample(sample) or known
                    state.add(sample)
                    live.update(view())
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return
                    await anyio.sleep(min(left, max(0.0, interval - (time.monotonic() - t0))))

            async with anyio.create_task_group() as tg:
                for url in metrics_urls:
                    tg.start_soon(role_of, url)
                    tg.start_soon(scrape_loop, url)
        if not console.is_terminal:
            console.line()  # Live ends a terminal's last line itself, not a file's
    if not state.any_answered:
        return 2
    # Judged at "now", not at the last sample: a gauge held through the final sleep counts too.
    return 1 if state.wedge_forming(time.monotonic_ns()) else 0
