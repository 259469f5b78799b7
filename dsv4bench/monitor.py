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
from .charset import response_text
from .dialect import QUEUE_GAUGES as QUEUE_GAUGES
from .dialect import trtllm_series


@dataclass(frozen=True)
class MetricSample:
    """One scrape of one endpoint: its values when it answered (`ok`), else why not (`error`)."""

    t_wall_ns: int
    t_ns: int  # monotonic: what the drain window and the stuck clocks are measured on
    endpoint: str
    ok: bool
    values: dict[str, float] | None = None  # {series: value}; None for a failed scrape
    error: str | None = None  # None for a good scrape

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
    return {series_key(s.name, s.labels): float(s.value) for fam in text_string_to_metric_families(text) for s in fam.samples}


async def scrape_once(client: httpx.AsyncClient, endpoint: str, timeout: float) -> MetricSample:
    t_wall_ns, t_ns = time.time_ns(), time.monotonic_ns()
    try:
        r = await client.get(endpoint, timeout=timeout)
        r.raise_for_status()
        values = parse_metrics(response_text(r))
    except (httpx.HTTPError, ValueError) as e:
        return MetricSample(t_wall_ns, t_ns, endpoint, False, error=f"{type(e).__name__}: {e}"[:200])
    return MetricSample(t_wall_ns, t_ns, endpoint, True, values=values)


async def monitor(endpoints: list[str], write: Callable[[MetricSample], None], interval: float = 1.0,
                  stop: anyio.Event | None = None, api_key: str | None = None) -> None:
    """Scrape every endpoint each `interval` seconds until cancelled or `stop` is set, handing
    each sample to `write` (`api_key`: for servers that guard /metrics too)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(trust_env=False, headers=headers) as client:
        while stop is None or not stop.is_set():
            t0 = anyio.current_time()
            async with anyio.create_task_group() as tg:
                for ep in endpoints:
                    tg.start_soon(_scrape_and_write, client, ep, write, interval)
            await anyio.sleep(max(0.0, interval - (anyio.current_time() - t0)))


async def _scrape_and_write(client: httpx.AsyncClient, ep: str, write: Callable[[MetricSample], None],
                            timeout: float) -> None:
    write(await scrape_once(client, ep, timeout))
