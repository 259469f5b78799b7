"""`--serve-metrics PORT`: the harness's own Prometheus metrics while a run goes on.

So corruption shows next to the server's queue depth in Grafana (dashboards/): sessions
active, turns by status, corrupt turns, tool calls, verdicts by code, nemesis kills. Every
series carries `run`, so two runs scraped by one Prometheus stay apart.

A custom collector reads `LiveStats` at scrape time: the driver already keeps those counters,
so there is nothing to keep in sync and no cost between scrapes. The registry is our own, not
prometheus_client's global one, so nothing else in the process (or a second exporter in a
test) leaks into or collides with it.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dsv4bench.errors import Dsv4benchError
from dsv4bench.harness.progress import LiveStats
from dsv4bench.report.slo import NOT_COUNTED, Outcome, SloTally

PREFIX = "dsv4bench"
# Every family this exporter exposes (counters without their `_total` suffix, as
# prometheus_client names families). The dashboard test checks panel exprs against these.
METRIC_NAMES: tuple[str, ...] = (
    f"{PREFIX}_sessions_active",
    f"{PREFIX}_sessions_done",
    f"{PREFIX}_turns",
    f"{PREFIX}_turns_corrupt",
    f"{PREFIX}_tool_calls",
    f"{PREFIX}_verdicts",
    f"{PREFIX}_kills",
    # With --slo only (report/slo.py; docs/slo.md): turns against the latency targets.
    f"{PREFIX}_slo_target_seconds",
    f"{PREFIX}_slo_turns",
    f"{PREFIX}_slo_good_output_tokens",
    f"{PREFIX}_slo_good_share",
    f"{PREFIX}_goodput_turns_per_second",
    f"{PREFIX}_goodput_tokens_per_second",
)


class ExporterError(Dsv4benchError):
    """The exporter could not start (one line, e.g. the port is taken)."""


class HarnessCollector(Collector):
    """Turns one LiveStats into metric families on every scrape."""

    def __init__(self, stats: LiveStats, run_id: str) -> None:
        self.stats = stats
        self.run_id = run_id

    def _counter(self, name: str, doc: str, value: float, **labels: str) -> CounterMetricFamily:
        c = CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=["run", *labels])
        c.add_metric([self.run_id, *labels.values()], float(value))
        return c

    def collect(self) -> Iterator[Metric]:
        s = self.stats
        g = GaugeMetricFamily(f"{PREFIX}_sessions_active", "Agent sessions running now.", labels=["run"])
        g.add_metric([self.run_id], float(s.sessions_active))
        yield g
        yield self._counter("sessions_done", "Agent sessions finished (any reason).", s.sessions_done)
        # LiveStats counts all turns plus killed and failed ones; ok is what is left. Corrupt turns
        # are ok turns (they completed) and are also exposed on their own below.
        ok = max(0, s.turns - s.turns_killed - s.turns_error)
        turns = CounterMetricFamily(f"{PREFIX}_turns", "Agent turns by status.", labels=["run", "status"])
        for status, n in (("ok", ok), ("killed", s.turns_killed), ("error", s.turns_error)):
            turns.add_metric([self.run_id, status], float(n))
        yield turns
        yield self._counter("turns_corrupt", "Completed turns with at least one corruption verdict.", s.turns_corrupt)
        yield self._counter("tool_calls", "Tool calls in completed turns.", s.tool_calls)
        verdicts = CounterMetricFamily(
            f"{PREFIX}_verdicts", "Turns carrying each verdict code.", labels=["run", "code"]
        )
        for code, n in sorted(s.verdicts.items()):
            verdicts.add_metric([self.run_id, code], float(n))
        yield verdicts
        # `kills` is bumped by the nemesis where it exists; a LiveStats without it reads 0.
        yield self._counter("kills", "Sessions killed by the nemesis.", getattr(s, "kills", 0))
        if s.slo is not None:
            yield from self._slo(s.slo, s.elapsed)

    def _gauge(self, name: str, doc: str, value: float | None) -> GaugeMetricFamily:
        g = GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=["run"])
        g.add_metric([self.run_id], float("nan") if value is None else float(value))
        return g

    def _slo(self, slo: SloTally, elapsed_s: float) -> Iterator[Metric]:
        """--slo's families: the counts a dashboard takes rates of, and the run-so-far figures
        report/slo.py gives (the rates over the time elapsed since the run started)."""
        targets = GaugeMetricFamily(
            f"{PREFIX}_slo_target_seconds", "The --slo latency targets.", labels=["run", "target"]
        )
        for name, seconds in slo.targets.given().items():
            targets.add_metric([self.run_id, name], seconds)
        yield targets
        turns = CounterMetricFamily(
            f"{PREFIX}_slo_turns",
            "Turns counted against --slo by outcome: met (good), missed, corrupt, failed; killed ones are not counted.",
            labels=["run", "outcome"],
        )
        for outcome in Outcome:
            if outcome not in NOT_COUNTED:
                turns.add_metric([self.run_id, outcome.value], float(slo.outcomes[outcome]))
        yield turns
        yield self._counter("slo_good_output_tokens", "Output tokens of the turns that met --slo.", slo.good_tokens)
        yield self._gauge("slo_good_share", "Share of counted turns that met --slo, so far.", slo.share)
        figures = slo.figures(elapsed_s)
        yield self._gauge(
            "goodput_turns_per_second",
            "Turns that met --slo per second of the run so far.",
            figures["goodput_turns_per_s"],
        )
        yield self._gauge(
            "goodput_tokens_per_second",
            "Output tokens of turns that met --slo per second of the run so far.",
            figures["goodput_tokens_per_s"],
        )


class _Handle:
    """What `start` returns: `.shutdown()` stops the server and joins its thread."""

    def __init__(self, server: Any, thread: Any) -> None:
        self.server = server
        self.thread = thread
        self.port: int = server.server_address[1]

    def shutdown(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


class HarnessExporter:
    """The harness's metrics on their own registry; `start(port)` serves them over HTTP."""

    def __init__(self, stats: LiveStats, run_id: str) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = HarnessCollector(stats, run_id)
        self.registry.register(self.collector)
        self._handle: _Handle | None = None

    def start(self, port: int, host: str = "127.0.0.1") -> _Handle:
        """Serve /metrics on host:port in a daemon thread; port 0 picks a free one (see `.port`)."""
        try:
            server, thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise ExporterError(f"--serve-metrics: {host}:{port} is already in use; pick another port") from e
            raise ExporterError(f"--serve-metrics: cannot listen on {host}:{port}: {e.strerror or e}") from e
        self._handle = _Handle(server, thread)
        return self._handle

    def shutdown(self) -> None:
        """Stop serving, if started; safe to call twice."""
        if self._handle is not None:
            self._handle.shutdown()
            self._handle = None
