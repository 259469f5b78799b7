"""Abort soak: kill-all storms against the clean PD engine (router, prefill and decode servers
on loopback, in this process). After every storm, no request may be queued, running or
transferring on either server and no page may be leaked.

Each storm starts --clients streamed chat requests at once (prompts of 5-150 words behind a
shared system prompt, so the prefill's prefix cache is in play; 16-400 output tokens) against
an engine with running slots for two thirds of them (the rest wait in the decode prealloc and
prefill bootstrap queues), waits a random 0 .. --max-delay seconds so the kill lands in every
stage of the PD pipeline, and
disconnects every client (every other storm also POSTs /abort_request abort_all to the
router). Then it waits for both servers to drain and checks: every queue gauge of the three
/metrics at 0 (as the harness parses them), no request left in the router, the prefill's
pages all in its prefix cache, the decode's pages all free, and each Scheduler's refcount
integrity check. The KV link is slowed (--link-gbps) so that kills also land on transfers
in flight.

    python scripts/abort_soak.py [--storms 1000 --clients 24 --max-minutes 12 --tiny]

Prints the figures; exit status 1 if any storm left anything behind, 2 if time ran out.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from collections import Counter
from dataclasses import dataclass

import httpx


from dsv4bench.engine.config import EngineConfig, ModelConfig
from dsv4bench.engine.launcher import free_ports
from dsv4bench.engine.pd import PDConfig, PDEngine, build_pd_engine
from dsv4bench.engine.pd.serve import listen, serve_together
from dsv4bench.engine.server import ServerConfig
from dsv4bench.monitor import parse_metrics
from dsv4bench.wedge import is_queue_gauge

STAGES = ("bootstrap", "prefill", "inflight", "prealloc", "transfer", "running")
SYSTEM = "You are a coding agent. Use the tools to read, change and test the repository. " * 4
WORDS = ("read", "file", "main.py", "test", "fix", "the", "bug", "in", "parser", "module", "then", "run", "ci")
TINY = ModelConfig(d_model=64, n_layers=2, n_heads=2, head_dim=32, rope_dim=16, window=32, csa_rate=2, hca_rate=8,
                   index_heads=2, index_dim=16, index_topk=4, n_experts=4, experts_per_token=2, expert_dim=64,
                   shared_expert_dim=64)


@dataclass(frozen=True)
class SoakConfig:
    storms: int = 1000
    clients: int = 24
    max_delay_s: float = 0.8
    drain_timeout_s: float = 10.0
    max_minutes: float = 12.0
    link_gbps: float = 0.02
    tiny: bool = False
    seed: int = 0


@dataclass
class StormResult:
    caught: Counter[str]  # requests in each stage at the kill
    finished: int  # requests that completed before the kill
    drain_s: float | None  # from the kill until nothing was left behind; None: not within the timeout
    leftovers: list[str]  # what was left behind; empty for a clean storm


def stage_counts(pd: PDEngine) -> Counter[str]:
    """Requests in each queue right now (len() of the engines' own queues: a snapshot the
    engine threads may change a moment later, which is all a kill sees too)."""
    p, d = pd.prefill, pd.decode
    return Counter({"bootstrap": len(p.bootstrap_queue), "prefill": len(p.prefilling),
                    "inflight": len(p.inflight_queue), "prealloc": len(d.prealloc_queue),
                    "transfer": len(d.transfer_queue), "running": len(d.decoding)})


def drained(pd: PDEngine) -> bool:
    return pd.prefill.stats.in_flight == 0 and pd.decode.stats.in_flight == 0 and not pd.router.active


def chat_body(rng: random.Random) -> dict:
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 150)))
    return {"model": "dsv4-mini", "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}],
            "max_tokens": rng.randint(16, 400), "temperature": 0, "stream": True}


async def one_request(client: httpx.AsyncClient, url: str, body: dict) -> None:
    async with client.stream("POST", url, json=body) as r:
        async for _ in r.aiter_lines():
            pass


async def leftovers(pd: PDEngine, client: httpx.AsyncClient, roots: dict[str, str]) -> list[str]:
    """Everything a drained PD engine must not have; empty when clean."""
    found = []
    for name, root in roots.items():
        values = parse_metrics((await client.get(f"{root}/metrics")).text)
        found += [f"{k}={v:g}" for k, v in values.items() if is_queue_gauge(k) and v]
    if pd.prefill.stats.leaked_pages:
        found.append(f"prefill: {pd.prefill.stats.leaked_pages} pages held outside the prefix cache")
    if pd.decode.stats.pages_used:
        found.append(f"decode: {pd.decode.stats.pages_used} pages held")
    for engine in (pd.prefill, pd.decode):
        try:
            await asyncio.wrap_future(engine.call(engine.scheduler.check_integrity))
        except AssertionError as e:
            found.append(f"integrity: {e}")
    return found


async def storm(i: int, pd: PDEngine, client: httpx.AsyncClient, roots: dict[str, str], rng: random.Random,
                cfg: SoakConfig) -> StormResult:
    url = f"{roots['router']}/v1/chat/completions"
    tasks = [asyncio.create_task(one_request(client, url, chat_body(rng))) for _ in range(cfg.clients)]
    await asyncio.sleep(rng.uniform(0, cfg.max_delay_s))
    caught = stage_counts(pd)
    finished = sum(t.done() and not t.cancelled() and t.exception() is None for t in tasks)
    for t in tasks:
        t.cancel()
    if i % 2:
        await client.post(f"{roots['router']}/abort_request", json={"abort_all": True})
    await asyncio.gather(*tasks, return_exceptions=True)
    t0 = time.monotonic()
    # NOTE: a request whose client left while it was still on the wire can reach the router
    # after the others drained; it is aborted as soon as its response starts. So the check is
    # "clean within the drain timeout", and only what is still there at the deadline counts.
    while True:
        found = await leftovers(pd, client, roots) if drained(pd) else [f"not drained: {dict(stage_counts(pd))}"]
        if not found:
            return StormResult(caught, finished, time.monotonic() - t0, [])
        if time.monotonic() - t0 > cfg.drain_timeout_s:
            return StormResult(caught, finished, None, [f"after {cfg.drain_timeout_s:g} s: {f}" for f in found])
        await asyncio.sleep(0.002)


async def soak(cfg: SoakConfig) -> int:
    # NOTE: fewer running slots than clients, so requests also wait for a decode slot: in the
    # decode prealloc queue and, their handshake pending, in the prefill bootstrap queue.
    slots = max(1, cfg.clients * 2 // 3)
    engine_cfg = EngineConfig(model=TINY, page_size=16, num_pages=4096, max_running_requests=slots, pd=True) \
        if cfg.tiny else EngineConfig(num_pages=4096, max_running_requests=slots, pd=True)
    ports = free_ports(3)
    sockets = [listen("127.0.0.1", p) for p in ports]
    pd = build_pd_engine(engine_cfg, PDConfig(prefill_port=ports[1], decode_port=ports[2], link_gbps=cfg.link_gbps),
                         random_weights=cfg.tiny)
    apps = pd.apps(ServerConfig(port=ports[0]))
    roots = {name: f"http://127.0.0.1:{p}" for name, p in zip(("router", "prefill", "decode"), ports)}
    stop = asyncio.Event()
    servers = asyncio.create_task(serve_together([(apps[k], s) for k, s in zip(roots, sockets)], stop=stop))
    rng = random.Random(cfg.seed)
    results: list[StormResult] = []
    t0 = time.monotonic()
    timed_out = False
    try:
        limits = httpx.Limits(max_connections=cfg.clients + 8)
        async with httpx.AsyncClient(timeout=60, limits=limits, trust_env=False) as client:
            while (await client.get(f"{roots['router']}/health")).status_code != 200:
                await asyncio.sleep(0.1)
            for i in range(cfg.storms):
                if time.monotonic() - t0 > cfg.max_minutes * 60:
                    timed_out = True
                    break
                results.append(await storm(i, pd, client, roots, rng, cfg))
                if results[-1].leftovers:
                    print(f"storm {i}: {'; '.join(results[-1].leftovers)}", flush=True)
                if (i + 1) % 100 == 0:
                    print(f"{i + 1} storms, {time.monotonic() - t0:.0f} s", flush=True)
    finally:
        stop.set()
        await servers
        pd.stop()
    report(cfg, results, time.monotonic() - t0)
    if timed_out:
        print(f"time ran out after {len(results)} of {cfg.storms} storms")
    return 1 if any(r.leftovers for r in results) else 2 if timed_out else 0


def report(cfg: SoakConfig, results: list[StormResult], wall_s: float) -> None:
    caught = sum((r.caught for r in results), Counter())
    drains = sorted(r.drain_s for r in results if r.drain_s is not None)
    dirty = [r for r in results if r.leftovers]
    n = len(results)
    print(f"abort soak: {n} storms x {cfg.clients} clients in {wall_s:.1f} s ({wall_s / max(n, 1):.2f} s/storm), "
          f"{'tiny random' if cfg.tiny else 'shipped'} model, link {cfg.link_gbps:g} GB/s")
    print(f"requests: {n * cfg.clients} sent, {sum(r.finished for r in results)} finished before their storm's kill")
    print("caught at the kill (per server: a request being prefilled also waits in the decode transfer queue): "
          + ", ".join(f"{s} {caught[s]}" for s in STAGES))
    if drains:
        print(f"clean after the kill within: median {statistics.median(drains) * 1e3:.0f} ms, "
              f"max {drains[-1] * 1e3:.0f} ms")
    print(f"storms leaving anything behind (queued, running or transferring requests, leaked pages, "
          f"broken refcounts): {len(dirty)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    d = SoakConfig()
    ap.add_argument("--storms", type=int, default=d.storms)
    ap.add_argument("--clients", type=int, default=d.clients, help="requests per storm")
    ap.add_argument("--max-delay", type=float, default=d.max_delay_s, help="longest wait before a kill, seconds")
    ap.add_argument("--max-minutes", type=float, default=d.max_minutes, help="stop after this long")
    ap.add_argument("--link-gbps", type=float, default=d.link_gbps, help="modelled KV link bandwidth")
    ap.add_argument("--tiny", action="store_true", help="a tiny random model instead of the shipped weights")
    ap.add_argument("--seed", type=int, default=d.seed)
    a = ap.parse_args()
    if a.storms < 1 or a.clients < 1 or a.max_delay < 0 or a.max_minutes <= 0:
        ap.error("--storms and --clients must be at least 1, --max-delay >= 0, --max-minutes > 0")
    cfg = SoakConfig(storms=a.storms, clients=a.clients, max_delay_s=a.max_delay, max_minutes=a.max_minutes,
                     link_gbps=a.link_gbps, tiny=a.tiny, seed=a.seed)
    return asyncio.run(soak(cfg))


if __name__ == "__main__":
    raise SystemExit(main())
