"""Prometheus monitors: scrape each /metrics endpoint on an interval into metrics.jsonl.

A scrape is a `MetricSample`; its record in metrics.jsonl is `{"t_wall_ns", "t_ns", "endpoint",
"values": {series: value}, "ok"}`, or `{"t_wall_ns", "t_ns", "endpoint", "ok", "error"}` for a
failed one, where a series is `name` or `name{label="v",...}` exactly as Prometheus prints it.
Parsing is prometheus-client's; an endpoint that is slow or down yields `ok: false` samples and
the monitor keeps going.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
from prometheus_client.parser import text_string_to_metric_families

# The gauges a wedge check reads are the dialect's (dialect.py); importable from here too.
from dsv4bench.wire.charset import response_text
from dsv4bench.servers.dialect import QUEUE_GAUGES as QUEUE_GAUGES
from dsv4bench.servers.dialect import NoIterationStats, trtllm_series
from dsv4bench.history.redact import KeyScope
from dsv4bench.servers.kinds import Kind, recognise, scrape_timeout


@dataclass(frozen=True)
class MetricSample:
    """One scrape of one endpoint: its values when it answered (`ok`), else why not (`error`)."""

    t_wall_ns: int
    t_ns: int  # monotonic: what the drain window and the stuck clocks are measured on
    endpoint: str
    ok: bool
    values: dict[str, float] | None = None  # {series: value}; None for a failed scrape
    error: str | None = None  # None for a good scrape
    # What the answer was beside its values, for the readers that judge a server by its kind
    # (watch, the monitor's timeout); not written to metrics.jsonl.
    status: int | None = None  # its HTTP status; None when nothing answered
    metrics_json: bool = False  # a JSON answer: TensorRT-LLM's iteration stats
    no_iteration: bool = False  # an empty list of them: no iteration ran since the last look

    def as_dict(self) -> dict[str, Any]:
        """The metrics.jsonl record: a good scrape has no `error` key, a failed one no `values`."""
        head: dict[str, Any] = {"t_wall_ns": self.t_wall_ns, "t_ns": self.t_ns, "endpoint": self.endpoint}
        if self.ok:
            return {**head, "values": self.values, "ok": True}
        return {**head, "ok": False, "error": self.error}


def series_key(name: str, labels: dict[str, str]) -> str:
    if not labels:
        return name
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def is_json_metrics(text: str) -> bool:
    """Whether a /metrics answer is JSON (TensorRT-LLM's iteration stats) rather than Prometheus text."""
    return text.lstrip()[:1] in ("[", "{")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text format -> {series: value} (histogram buckets and all); TensorRT-LLM's JSON
    iteration stats -> their latest iteration's `trtllm:` series (dialect.trtllm_series).
    ValueError for a page that is neither."""
    if is_json_metrics(text):
        try:
            stats = json.loads(text)
        except (ValueError, RecursionError):
            raise ValueError("JSON /metrics that does not parse") from None
        return trtllm_series(stats)
    return {
        series_key(s.name, s.labels): float(s.value)
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


async def scrape_once(client: httpx.AsyncClient, endpoint: str, timeout: float) -> MetricSample:
    t_wall_ns, t_ns = time.time_ns(), time.monotonic_ns()
    status, text = None, ""
    try:
        r = await client.get(endpoint, timeout=timeout)
        status = r.status_code
        r.raise_for_status()
        text = response_text(r)
        values = parse_metrics(text)
    except (httpx.HTTPError, ValueError) as e:
        return MetricSample(
            t_wall_ns,
            t_ns,
            endpoint,
            False,
            error=f"{type(e).__name__}: {e}"[:200],
            status=status,
            metrics_json=is_json_metrics(text),
            no_iteration=isinstance(e, NoIterationStats),
        )
    return MetricSample(
        t_wall_ns, t_ns, endpoint, True, values=values, status=status, metrics_json=is_json_metrics(text)
    )


def kind_of_sample(sample: MetricSample) -> Kind | None:
    """The kind a scrape's answer shows (the names of its series, or TensorRT-LLM's JSON), or
    None where it shows none: a failed scrape, or series of no known server."""
    if not sample.ok and not sample.metrics_json:
        return None
    k, _ = recognise(None, sample.values, metrics_json=sample.metrics_json)
    return k if k.known else None


async def monitor(
    endpoints: list[str],
    write: Callable[[MetricSample], None],
    interval: float = 1.0,
    stop: anyio.Event | None = None,
    api_key: str | None = None,
    scope: KeyScope | None = None,
) -> None:
    """Scrape every endpoint each `interval` seconds until cancelled or `stop` is set, handing
    each sample to `write` (`api_key`: for servers that guard /metrics too; `scope`: which
    endpoints it may go to where some were found behind a router, not named: redact.KeyScope).
    Each endpoint is scraped on its own clock, with its kind's timeout (server_kinds.scrape_timeout):
    a server whose /metrics holds the request (TensorRT-LLM's) delays no other endpoint's samples."""
    if scope is None:
        scope = KeyScope(api_key, endpoints)
    headers = {"Authorization": f"Bearer {scope.api_key}"} if scope.api_key else {}
    async with (
        httpx.AsyncClient(trust_env=False, headers=headers) as keyed,
        httpx.AsyncClient(trust_env=False) as keyless,
    ):
        async with anyio.create_task_group() as tg:
            for ep in endpoints:
                tg.start_soon(_scrape_loop, keyed if scope.allows(ep) else keyless, ep, write, interval, stop)


async def _scrape_loop(
    client: httpx.AsyncClient, ep: str, write: Callable[[MetricSample], None], interval: float, stop: anyio.Event | None
) -> None:
    known: Kind | None = None  # the kind its answers showed; kept once seen
    while stop is None or not stop.is_set():
        t0 = anyio.current_time()
        sample = await scrape_once(client, ep, scrape_timeout(known, interval))
        known = kind_of_sample(sample) or known
        write(sample)
        await anyio.sleep(max(0.0, interval - (anyio.current_time() - t0)))
