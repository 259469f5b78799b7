"""Prefill throughput of the bundled engine on long agent prompts: what bounds how fast a run can
fill a production-sized KV pool (docs/cache-pressure.md).

Starts `dsv4bench engine serve` with the given engine flags on free loopback ports, builds
long-context sessions' first requests (`--context`'s openings: real reads of each session's
world), sends each once with max_tokens 1, first one alone and then `--parallel` at a time, and
prints the prompt tokens per second of each phase. A 1,048,576-token pool fills no faster than
pool / rate seconds.

    python scripts/bench_long_prefill.py --context 14k,15k --requests 16 --parallel 8
    python scripts/bench_long_prefill.py --engine-arg=--chunked-prefill-tokens=8192
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import sys
import time

import httpx

from dsv4bench.agents import FAMILIES
from dsv4bench.engine.launcher import start_engine
from dsv4bench.harness.context_profile import parse_context
from dsv4bench.harness.session import AgentSession, SessionConfig

CONTEXT = 16_384  # the bundled model's


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--context", default="14k,15k", help="The sessions' depth profile (agents --context).")
    p.add_argument("--scenario", default="ops", choices=sorted(FAMILIES))
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--parallel", type=int, default=8)
    p.add_argument("--engine-arg", action="append", default=[], help="A flag for engine serve (repeatable).")
    a = p.parse_args()
    profile = parse_context(a.context)
    with start_engine(a.engine_arg) as engine:
        root = engine.roots[0]
        config = SessionConfig(model="dsv4-mini", context_tokens=CONTEXT, context_profile=profile, stream=False)

        def prefill(seed: int) -> tuple[int, float]:
            body = AgentSession(f"s{seed}", FAMILIES[a.scenario], seed, config).next_request()
            body["max_tokens"] = 1
            t0 = time.perf_counter()
            r = httpx.post(f"{root}/v1/chat/completions", json=body, timeout=900)
            r.raise_for_status()
            return int(r.json()["usage"]["prompt_tokens"]), time.perf_counter() - t0

        tokens, seconds = prefill(10_000)
        print(f"alone: {tokens:,} prompt tokens in {seconds:.2f} s = {tokens / seconds:,.0f} tok/s")
        t0 = time.perf_counter()
        with cf.ThreadPoolExecutor(a.parallel) as pool:
            done = list(pool.map(prefill, range(a.requests)))
        wall = time.perf_counter() - t0
        total = sum(t for t, _ in done)
        print(
            f"{a.parallel} at a time: {a.requests} prompts, {total:,} tokens (median {sorted(t for t, _ in done)[len(done) // 2]:,}) "
            f"in {wall:.1f} s = {total / wall:,.0f} tok/s; a 1,048,576-token pool fills in >= {1_048_576 / (total / wall):,.0f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
