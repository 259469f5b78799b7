"""`dsv4bench probe`: the one-shot wedge check from the incident, for each server root URL.

The manual probe during the incident was: read each server's queue gauges, hit `/health`,
send one request and see whether it hangs. This does exactly that, concurrently per endpoint,
and classifies each server as healthy, wedged or unreachable. Exit codes are for scripts and
CI: 0 all healthy, 1 some wedged, 2 some unreachable (unreachable wins: we know least there).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
from rich.console import Console
from rich.table import Table

from .canary import canary, health
from .monitor import parse_metrics
from .wedge import WedgeConfig, detect_wedge, is_queue_gauge, metric_name

PD_GAUGES = (
    "sglang:num_prefill_bootstrap_queue_reqs",
    "sglang:num_prefill_inflight_queue_reqs",
    "sglang:num_decode_prealloc_queue_reqs",
    "sglang:num_decode_transfer_queue_reqs",
)
RUNNING = ("sglang:num_running_reqs", "vllm:num_requests_running")
WAITING = ("sglang:num_queue_reqs", "vllm:num_requests_waiting")


@dataclass
class EndpointProbe:
    """What one server answered, and the state we conclude from it."""

    root: str
    metrics_error: str | None = None
    gauges: dict[str, float] = field(default_factory=dict)  # queue gauge series -> value
    health: dict[str, Any] = field(default_factory=dict)
    health_generate: dict[str, Any] = field(default_factory=dict)
    canary: dict[str, Any] = field(default_factory=dict)
    state: str = "healthy"  # healthy | wedged | unreachable
    codes: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)

    def gauge_sum(self, names: tuple[str, ...]) -> float | None:
        vals = [v for k, v in self.gauges.items() if metric_name(k) in names]
        return sum(vals) if vals else None


@dataclass
class ProbeResult:
    endpoints: list[EndpointProbe]

    def to_json(self) -> dict[str, Any]:
        return {"exit_code": probe_exit_code(self), "endpoints": [asdict(e) for e in self.endpoints]}


async def _metrics(client: httpx.AsyncClient, ep: EndpointProbe, timeout: float) -> None:
    try:
        with anyio.fail_after(timeout):
            r = await client.get(ep.root + "/metrics", timeout=timeout)
        r.raise_for_status()
        ep.gauges = {k: v for k, v in sorted(parse_metrics(r.text).items()) if is_queue_gauge(k)}
    except (httpx.HTTPError, ValueError, TimeoutError) as e:
        ep.metrics_error = f"{type(e).__name__}: {e}"[:200]


async def _canary(client: httpx.AsyncClient, ep: EndpointProbe, timeout: float) -> None:
    model = "default"  # SGLang serves any name; used when /v1/models itself is broken
    try:
        with anyio.fail_after(timeout):
            r = await client.get(ep.root + "/v1/models", timeout=timeout)
        if r.status_code == 200 and r.json().get("data"):
            model = r.json()["data"][0]["id"]
    except (httpx.HTTPError, ValueError, TimeoutError, KeyError, IndexError, TypeError):
        pass
    ep.canary = await canary(client, ep.root + "/v1", model, timeout=timeout)


def _classify(ep: EndpointProbe) -> None:
    nothing_answered = (ep.metrics_error is not None and ep.health.get("status") is None
                        and ep.health_generate.get("status") is None and not ep.canary.get("ok")
                        and not str(ep.canary.get("error") or "").startswith("HTTP "))
    if nothing_answered:
        ep.state = "unreachable"
        ep.reasons.append(f"{ep.root}: nothing answered (metrics: {ep.metrics_error})")
        return
    # Reuse the detector's canary / health rules so probe and run verdicts never disagree.
    found = detect_wedge([], 0, WedgeConfig(), health=[ep.health], canaries=[ep.canary])
    codes: set[str] = set()
    for f in found.values():
        codes.update(f["codes"])
        ep.reasons.extend(f["details"])
    if not ep.canary.get("ok"):
        # One look cannot measure a duration; a non-empty queue beside a hanging canary is the
        # incident's signature, so it counts as stuck here.
        for k, v in ep.gauges.items():
            if v > 0:
                codes.add("queue_stuck")
                ep.reasons.append(f"{k}={v:g} on {ep.root}/metrics while the canary fails")
    ep.codes = sorted(codes)
    ep.state = "wedged" if codes else "healthy"


async def probe_async(endpoints: list[str], timeout: float = 10.0) -> ProbeResult:
    """Probe every endpoint concurrently; each check is bounded by `timeout` seconds."""
    eps = [EndpointProbe(root=e.rstrip("/")) for e in endpoints]

    async def one(client: httpx.AsyncClient, ep: EndpointProbe) -> None:
        async def set_health(path: str, attr: str) -> None:
            setattr(ep, attr, await health(client, ep.root, path, timeout=timeout))

        async with anyio.create_task_group() as tg:
            tg.start_soon(_metrics, client, ep, timeout)
            tg.start_soon(set_health, "/health", "health")
            tg.start_soon(set_health, "/health_generate", "health_generate")
            tg.start_soon(_canary, client, ep, timeout)
        _classify(ep)

    async with httpx.AsyncClient(trust_env=False) as client:
        async with anyio.create_task_group() as tg:
            for ep in eps:
                tg.start_soon(one, client, ep)
    return ProbeResult(eps)


def probe(endpoints: list[str], timeout: float = 10.0) -> ProbeResult:
    """Synchronous wrapper around probe_async (the CLI and tests call this)."""
    return anyio.run(probe_async, endpoints, timeout)


def probe_exit_code(result: ProbeResult) -> int:
    states = {e.state for e in result.endpoints}
    return 2 if "unreachable" in states else 1 if "wedged" in states else 0


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:g}"


def _short_error(error: str | None) -> str:
    """Table cells stay narrow; the full error is in the JSON and the finding lines."""
    if not error:
        return "-"
    if error.startswith("timeout"):
        return "timeout"
    if error.startswith("ConnectError"):
        return "refused"
    return error[:16]


def _status(h: dict[str, Any]) -> str:
    return str(h["status"]) if h.get("status") is not None else _short_error(h.get("error"))


def render_probe(result: ProbeResult, console: Console) -> None:
    """One row per endpoint, then one line per finding (full gauge names, never truncated)."""
    table = Table(title="dsv4bench probe")
    # Short headers so 80 columns fit; the PD queues in request order (prefill, then decode).
    table.add_column("endpoint", overflow="fold")
    for col in ("run", "queue", "bootstrap", "inflight", "prealloc", "transfer",
                "/health", "/health_generate", "canary", "state"):
        table.add_column(col, overflow="fold")
    colors = {"healthy": "green", "wedged": "red", "unreachable": "yellow"}
    for ep in result.endpoints:
        c = ep.canary
        canary_cell = f"{c['latency_s']:.2f} s" if c.get("ok") else _short_error(c.get("error"))
        table.add_row(ep.root, _num(ep.gauge_sum(RUNNING)), _num(ep.gauge_sum(WAITING)),
                      *(_num(ep.gauge_sum((g,))) for g in PD_GAUGES),
                      _status(ep.health), _status(ep.health_generate), canary_cell,
                      f"[{colors[ep.state]}]{ep.state}[/]")
    console.print(table)
    # Plain lines too: a narrow terminal squeezes the table, and scripts grep these.
    for ep in result.endpoints:
        codes = f" ({', '.join(ep.codes)})" if ep.codes else ""
        console.print(f"{ep.root}: {ep.state}{codes}", markup=False, highlight=False, soft_wrap=True)
        for reason in ep.reasons:
            console.print(f"  {reason}", markup=False, highlight=False, soft_wrap=True)


def probe_main(endpoints: list[str], timeout: float, json_out: Path | None) -> int:
    """CLI body of `dsv4bench probe`: table to stdout, optional JSON file, exit code returned."""
    result = probe(endpoints, timeout)
    render_probe(result, Console())
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(result.to_json(), indent=2) + "\n", encoding="utf-8")
    return probe_exit_code(result)
