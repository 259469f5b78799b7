"""Abort soak: kill-all storms against the clean PD engine, judged as a user could judge it.

The bundled engine runs as a deployment of processes on loopback (engine/launcher.py): a
prefill and a decode half behind a PD router, ours (`--router bundled`, the default) or
SGLang's real one (`--router sglang`). Everything is read over HTTP: nothing of the engines'
insides, so the same judgement would hold for any SGLang-shaped deployment.

Each storm starts --clients streamed chat requests at once (prompts of 5-150 words behind a
shared system prompt, so the prefill's prefix cache is in play; 16-400 output tokens) against
halves with running slots for two thirds of them (the rest wait in the decode prealloc and
prefill bootstrap queues), waits a random 0 .. --max-delay seconds so the kill lands in every
stage of the PD pipeline, scrapes both halves' queue gauges (what the kill caught), and
disconnects every client (every other storm also POSTs /abort_request abort_all to the router;
where the router has no such endpoint, as SGLang's, to both halves). Then it waits for the
deployment to drain and checks that nothing is left: every queue gauge of both halves at 0 (as
the harness parses them, dsv4bench/servers/dialect.py), the router's own in-flight gauge at 0 (ours:
`sglang:num_running_reqs{engine_type="router"}`; SGLang's: `smg_worker_requests_active` per
worker on its Prometheus port), then `POST /flush_cache` on the prefill (which succeeds only
when it is idle) and `sglang:num_used_tokens` 0 on both halves: a page still in use then is a
leak. The KV link is slowed (--link-gbps) so that kills also land on transfers in flight.

    python scripts/abort_soak.py [--storms 1000 --clients 24 --max-minutes 30 --router sglang --tiny]

Prints a line per storm and the figures, and stops at the first storm that leaves anything
behind (what is left stays: later storms would only see it again) unless --keep-going; exit
status 1 if any storm left anything behind, 2 if time ran out or the deployment did not come up.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import shlex
import sys
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx

from dsv4bench.servers.dialect import is_queue_gauge, metric_name
from dsv4bench.engine.launcher import EngineStartError, start_engine
from dsv4bench.servers.monitor import parse_metrics
from dsv4bench.servers.roles import (
    DECODE,
    GAUGE_LABELS,
    PREFILL,
    ROUTER,
    own_gauges_shown,
    part_labels,
    role_from_metrics,
)

ROUTERS = ("bundled", "sglang")
HALVES = (PREFILL, DECODE)
SYSTEM = "You are a coding agent. Use the tools to read, change and test the repository. " * 4
WORDS = ("read", "file", "main.py", "test", "fix", "the", "bug", "in", "parser", "module", "then", "run", "ci")
USED_TOKENS = "sglang:num_used_tokens"
# SGLang's router counts the requests it has passed to each worker and not yet seen end
# (`sgl_router_running_requests` before the `smg_` names); not a queue, but a request it still
# counts after the drain is one it lost track of.
ROUTER_IN_FLIGHT = frozenset({"smg_worker_requests_active", "sgl_router_running_requests"})

Scrapes = dict[str, dict[str, float]]  # role -> one parsed /metrics page


@dataclass(frozen=True)
class SoakConfig:
    storms: int = 1000
    clients: int = 24
    max_delay_s: float = 0.8
    drain_timeout_s: float = 10.0
    max_minutes: float = 30.0
    link_gbps: float = 0.02
    tiny: bool = False
    seed: int = 0
    router: str = "bundled"
    keep_going: bool = False  # storm on after one left something behind

    def engine_args(self) -> list[str]:
        """`engine serve` flags of both halves."""
        # NOTE: fewer running slots than clients, so requests also wait for a decode slot: in the
        # decode prealloc queue and, their handshake pending, in the prefill bootstrap queue.
        slots = max(1, self.clients * 2 // 3)
        return [
            "--num-pages",
            "4096",
            "--max-running-requests",
            str(slots),
            "--pd-link-gbps",
            f"{self.link_gbps:g}",
            *(["--random-weights"] if self.tiny else []),
        ]


@dataclass
class StormResult:
    caught: Counter[str]  # requests in each "<half> <stage>" at the kill, from the halves' gauges
    finished: int  # requests that completed before the kill
    drain_s: float | None  # from the kill until nothing was left behind; None: not within the timeout
    leftovers: list[str]  # what was left behind; empty for a clean storm
    abort_all: str = ""  # where this storm's abort_all went ("router", "halves"), "" when it sent none


@dataclass(frozen=True)
class Endpoints:
    """Where the deployment answers: the router's OpenAI base URL and each part's /metrics."""

    url: str  # .../v1
    metrics: dict[str, str] = field(default_factory=dict)  # role -> /metrics URL

    @property
    def router_root(self) -> str:
        return self.url.removesuffix("/").removesuffix("/v1")

    @property
    def prefill_root(self) -> str:
        return self.metrics[PREFILL].removesuffix("/metrics")

    @property
    def halves(self) -> dict[str, str]:
        return {r: self.metrics[r] for r in HALVES}


# ---- judging: scrapes in, findings out ---------------------------------------------------------


def _series(role: str, key: str, value: float) -> str:
    parts = part_labels(key)
    return f"{role} {metric_name(key)}{f'{{{parts}}}' if parts else ''}={value:g}"


def in_flight(scrapes: Scrapes) -> list[str]:
    """Every request a scrape still shows anywhere: a queue gauge above 0 (any part), or the
    router's own count of requests it passed on. Empty when the deployment is idle."""
    return [
        _series(role, k, v)
        for role, values in scrapes.items()
        for k, v in values.items()
        if v and (is_queue_gauge(k) or metric_name(k) in ROUTER_IN_FLIGHT)
    ]


def pages_held(scrapes: Scrapes) -> list[str]:
    """KV token slots a half still has in use; after a successful /flush_cache of an idle
    deployment these are pages that never came back."""
    return [
        _series(role, k, v)
        for role in HALVES
        for k, v in scrapes.get(role, {}).items()
        if v and metric_name(k) == USED_TOKENS
    ]


def caught_at_kill(scrapes: Scrapes) -> Counter[str]:
    """Requests per "<half> <stage>" (its own queue gauges, in the order a request passes them)."""
    caught: Counter[str] = Counter()
    for role in HALVES:
        values = scrapes.get(role, {})
        names = {metric_name(k) for k in values if is_queue_gauge(k)}
        for gauge in own_gauges_shown(role, names):
            caught[f"{role} {GAUGE_LABELS[gauge]}"] += int(
                sum(v for k, v in values.items() if metric_name(k) == gauge and is_queue_gauge(k))
            )
    return caught


def idle_findings(after_flush: Scrapes, flush_status: int, flush_text: str) -> list[str]:
    """What a drained deployment has left once the prefill was asked to flush its cache."""
    if flush_status != 200:
        return [f"prefill /flush_cache answered {flush_status}: {flush_text.strip()[:200]}"]
    return in_flight(after_flush) + pages_held(after_flush)


def roles_of(pages: dict[str, dict[str, float]]) -> dict[str, str]:
    """Each /metrics URL's role (router, prefill, decode) from what it exposes; one of each."""
    found: dict[str, list[str]] = {}
    for url, values in pages.items():
        role = role_from_metrics(values)
        if role is not None:
            found.setdefault(role.name, []).append(url)
    if any(len(found.get(r, [])) != 1 for r in (ROUTER, *HALVES)):
        raise ValueError(f"expected one router, one prefill and one decode /metrics, found {found}")
    return {r: urls[0] for r, urls in found.items()}


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of values sorted ascending."""
    return sorted_values[max(1, math.ceil(q / 100 * len(sorted_values))) - 1]


def storm_line(i: int, n: int, r: StormResult) -> str:
    caught = ", ".join(f"{k} {v}" for k, v in r.caught.items() if v) or "nothing"
    end = (
        f"clean in {r.drain_s * 1e3:.0f} ms"
        if r.drain_s is not None and not r.leftovers
        else "LEFT BEHIND: " + "; ".join(r.leftovers)
    )
    abort = f", abort_all via {r.abort_all}" if r.abort_all else ""
    return f"storm {i + 1}/{n}: caught {caught}; {r.finished} finished before the kill{abort}; {end}"


def summary(cfg: SoakConfig, results: list[StormResult], wall_s: float, router: str) -> list[str]:
    caught: Counter[str] = Counter()
    for r in results:
        caught.update(r.caught)  # keeps the stages no kill caught anything in, as 0
    drains = sorted(r.drain_s for r in results if r.drain_s is not None and not r.leftovers)
    dirty = [r for r in results if r.leftovers]
    n = len(results)
    lines = [
        f"abort soak: {n} storms x {cfg.clients} clients in {wall_s:.1f} s ({wall_s / max(n, 1):.2f} s/storm), "
        f"router {router}, {'random' if cfg.tiny else 'shipped'} weights, link {cfg.link_gbps:g} GB/s",
        f"requests: {n * cfg.clients} sent, {sum(r.finished for r in results)} finished before their storm's kill",
        "caught at the kill (per half, from its gauges; a request whose KV is moving counts on both): "
        + (", ".join(f"{k} {v}" for k, v in caught.items()) or "none"),
    ]
    routes = Counter(r.abort_all for r in results if r.abort_all)
    if routes:
        lines.append("abort_all sent to: " + ", ".join(f"the {k} ({v} storms)" for k, v in sorted(routes.items())))
    if drains:
        lines.append(
            f"drained after the kill: p50 {percentile(drains, 50) * 1e3:.0f} ms, "
            f"p99 {percentile(drains, 99) * 1e3:.0f} ms, max {drains[-1] * 1e3:.0f} ms"
        )
    lines.append(
        f"storms leaving anything behind (queued, running or transferring requests, requests open in the "
        f"router, pages in use after /flush_cache): {len(dirty)}"
    )
    return lines


# ---- the deployment --------------------------------------------------------------------------


def start_deployment(router: str, engine_args: list[str]) -> Any:
    """The bundled PD engine as processes behind `router`; a handle with `.url`,
    `.metrics_urls` and `.stop()`."""
    return start_engine(["--pd", *(["--router", "sglang"] if router == "sglang" else []), *engine_args])


def router_name(router: str) -> str:
    from dsv4bench.engine import sglang_router

    return "bundled" if router == "bundled" else sglang_router.label()


async def discover(client: httpx.AsyncClient, url: str, metrics_urls: Iterable[str]) -> Endpoints:
    pages = {}
    for u in metrics_urls:
        r = await client.get(u)
        if r.status_code == 200:
            pages[u] = parse_metrics(r.text)
    return Endpoints(url, roles_of(pages))


async def scrape(client: httpx.AsyncClient, urls: dict[str, str]) -> tuple[Scrapes, list[str]]:
    """Every role's page at once; and a line for each that did not answer."""

    async def one(url: str) -> dict[str, float] | str:
        try:
            r = await client.get(url)
            return parse_metrics(r.text) if r.status_code == 200 else f"/metrics answered {r.status_code}"
        except (httpx.HTTPError, ValueError) as e:
            return f"/metrics unreachable: {type(e).__name__}"

    pages = dict(zip(urls, await asyncio.gather(*(one(u) for u in urls.values()))))
    return (
        {r: p for r, p in pages.items() if isinstance(p, dict)},
        [f"{r} {p}" for r, p in pages.items() if isinstance(p, str)],
    )


# ---- storms ----------------------------------------------------------------------------------


def chat_body(rng: random.Random) -> dict:
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 150)))
    return {
        "model": "dsv4-mini",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}],
        "max_tokens": rng.randint(16, 400),
        "temperature": 0,
        "stream": True,
    }


async def one_request(client: httpx.AsyncClient, url: str, body: dict) -> None:
    async with client.stream("POST", url, json=body) as r:
        async for _ in r.aiter_lines():
            pass


async def abort_all(control: httpx.AsyncClient, ep: Endpoints) -> str:
    """POST abort_all to the router; to both halves where the router has no such endpoint."""
    body = {"abort_all": True}
    if (await control.post(f"{ep.router_root}/abort_request", json=body)).status_code not in (404, 405):
        return "router"
    await asyncio.gather(
        *(control.post(f"{u.removesuffix('/metrics')}/abort_request", json=body) for u in ep.halves.values())
    )
    return "halves"


async def drain(control: httpx.AsyncClient, ep: Endpoints, timeout_s: float) -> tuple[float | None, list[str]]:
    """(seconds from now until the deployment was seen idle and clean, findings at the deadline)."""
    t0 = time.monotonic()
    # NOTE: a request whose client left while it was still on the wire can reach a half after
    # the others drained; it is aborted as soon as its response starts. So the check is "clean
    # within the drain timeout", and only what is still there at the deadline counts.
    while True:
        scrapes, down = await scrape(control, ep.metrics)
        found = down + in_flight(scrapes)
        if not found:
            drained_s = time.monotonic() - t0
            r = await control.post(f"{ep.prefill_root}/flush_cache")
            after, down = await scrape(control, ep.metrics)
            found = down + idle_findings(after, r.status_code, r.text)
            if not found:
                return drained_s, []
        if time.monotonic() - t0 > timeout_s:
            return None, [f"after {timeout_s:g} s: {'; '.join(found)}"]
        await asyncio.sleep(0.005)


async def storm(
    i: int, ep: Endpoints, client: httpx.AsyncClient, control: httpx.AsyncClient, rng: random.Random, cfg: SoakConfig
) -> StormResult:
    url = f"{ep.url}/chat/completions"
    tasks = [asyncio.create_task(one_request(client, url, chat_body(rng))) for _ in range(cfg.clients)]
    await asyncio.sleep(rng.uniform(0, cfg.max_delay_s))
    at_kill, _ = await scrape(control, ep.halves)
    finished = sum(t.done() and not t.cancelled() and t.exception() is None for t in tasks)
    for t in tasks:
        t.cancel()
    via = await abort_all(control, ep) if i % 2 else ""
    await asyncio.gather(*tasks, return_exceptions=True)
    drain_s, left = await drain(control, ep, cfg.drain_timeout_s)
    return StormResult(caught_at_kill(at_kill), finished, drain_s, left, via)


async def soak(cfg: SoakConfig, url: str, metrics_urls: list[str], router: str) -> int:
    rng = random.Random(cfg.seed)
    results: list[StormResult] = []
    timed_out = stopped = False
    limits = httpx.Limits(max_connections=cfg.clients + 8)
    async with (
        httpx.AsyncClient(timeout=60, limits=limits, trust_env=False) as client,
        httpx.AsyncClient(timeout=30, trust_env=False) as control,
    ):
        try:
            ep = await discover(control, url, metrics_urls)
        except (httpx.HTTPError, ValueError) as e:
            print(f"abort soak: cannot tell the deployment's parts apart: {e}", file=sys.stderr)
            return 2
        t0 = time.monotonic()
        for i in range(cfg.storms):
            if time.monotonic() - t0 > cfg.max_minutes * 60:
                timed_out = True
                break
            try:
                results.append(await storm(i, ep, client, control, rng, cfg))
            except httpx.HTTPError as e:  # the control requests: a part stopped answering
                results.append(StormResult(Counter(), 0, None, [f"the deployment stopped answering: {e!r}"]))
                stopped = True
            print(storm_line(i, cfg.storms, results[-1]), flush=True)
            if not results[-1].leftovers:
                continue
            down = (await scrape(control, ep.metrics))[1]
            if stopped or down:
                print(
                    f"the deployment no longer answers ({'; '.join(down) or 'control request failed'}): stopping",
                    flush=True,
                )
                break
            if not cfg.keep_going:
                # NOTE: what is left stays, so every later storm would read it again (and wait out
                # its drain timeout): the first storm that leaves something is the finding.
                print(f"storm {i + 1} left something behind: stopping (--keep-going storms on)", flush=True)
                break
        wall = time.monotonic() - t0
    print("\n".join(summary(cfg, results, wall, router)))
    if timed_out:
        print(f"time ran out after {len(results)} of {cfg.storms} storms")
    return 1 if any(r.leftovers for r in results) else 2 if timed_out else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    d = SoakConfig()
    ap.add_argument("--storms", type=int, default=d.storms)
    ap.add_argument("--clients", type=int, default=d.clients, help="requests per storm")
    ap.add_argument("--max-delay", type=float, default=d.max_delay_s, help="longest wait before a kill, seconds")
    ap.add_argument(
        "--drain-timeout",
        type=float,
        default=d.drain_timeout_s,
        help="how long a storm's leftovers may take to clear, seconds",
    )
    ap.add_argument("--max-minutes", type=float, default=d.max_minutes, help="stop after this long")
    ap.add_argument("--link-gbps", type=float, default=d.link_gbps, help="modelled KV link bandwidth")
    ap.add_argument(
        "--router",
        choices=ROUTERS,
        default=d.router,
        help="the PD router in front of the halves: ours, or SGLang's (sglang-router)",
    )
    ap.add_argument(
        "--tiny", action="store_true", help="random weights instead of the shipped ones (no weights to load)"
    )
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument(
        "--keep-going",
        action="store_true",
        help="storm on after a storm left something behind (later storms then see it too)",
    )
    a = ap.parse_args()
    if a.storms < 1 or a.clients < 1 or a.max_delay < 0 or a.max_minutes <= 0 or a.drain_timeout <= 0:
        ap.error("--storms and --clients must be at least 1, --max-delay >= 0, --max-minutes and --drain-timeout > 0")
    cfg = SoakConfig(
        storms=a.storms,
        clients=a.clients,
        max_delay_s=a.max_delay,
        drain_timeout_s=a.drain_timeout,
        max_minutes=a.max_minutes,
        link_gbps=a.link_gbps,
        tiny=a.tiny,
        seed=a.seed,
        router=a.router,
        keep_going=a.keep_going,
    )
    print("reproduce: " + shlex.join(["python", "scripts/abort_soak.py", *sys.argv[1:]]), flush=True)
    try:
        # NOTE: started from this thread, which the engine's processes die with (launcher.py).
        deployment = start_deployment(cfg.router, cfg.engine_args())
    except EngineStartError as e:
        print(f"abort soak: {e}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(soak(cfg, deployment.url, list(deployment.metrics_urls), router_name(cfg.router)))
    finally:
        deployment.stop()


if __name__ == "__main__":
    raise SystemExit(main())
