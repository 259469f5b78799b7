"""DSV4-mini serving throughput: output tokens/s and per-step latency at batch 1, 8 and 80.

Each batch size runs `batch` concurrent requests through the real engine loop (scheduler,
model runner, default model config, seeded random weights), each with its own prompt of
--prompt-tokens tokens. Requests generate long enough that, once every prompt is prefilled,
--max-tokens steps decode the whole batch at once. Reported per batch size:
  - per-step latency (median, p90) of the steps that decode all `batch` requests and nothing
    else, and the output tokens/s that gives (batch / step time);
  - median latency of the steps that carry a prefill chunk (chunked prefill, mixed with decodes);
  - time until every request of the batch has its first token.

    python scripts/bench_engine.py [--prompt-tokens 2048 --max-tokens 32 --batches 1,8,80]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

import torch


from dsv4bench.engine.config import EngineConfig
from dsv4bench.engine.unified_engine import AsyncEngine, UnifiedEngine
from dsv4bench.engine.memory import PageAllocator
from dsv4bench.engine.model.model import DSV4Mini
from dsv4bench.engine.model_runner import ModelRunner
from dsv4bench.engine.radix_cache import RadixCache
from dsv4bench.engine.request import SamplingParams
from dsv4bench.engine.scheduler import Scheduler


class TimedRunner:
    """Wraps the model runner to time each step and tell decode steps from prefill steps."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.steps: list[tuple[int, int, float]] = []  # (decodes, prefill tokens, ms)

    def __call__(self, batch):
        t0 = time.perf_counter()
        out = self.runner(batch)
        ms = (time.perf_counter() - t0) * 1e3
        self.steps.append((batch.num_decode, batch.num_prefill_tokens, ms))
        return out

    def forget(self, rid: str) -> None:
        self.runner.forget(rid)


async def run_batch(engine: AsyncEngine, batch: int, prompt_tokens: int, max_tokens: int, vocab: int,
                    chunk: int) -> float:
    """Run one batch; returns seconds until every request had its first token."""
    # The first request decodes during every later prefill step, so it must outlast them all.
    prefill_steps = -(-batch * prompt_tokens // chunk) + batch
    params = SamplingParams(max_tokens=prefill_steps + max_tokens, temperature=0.0, stop_token_ids=())
    start = time.perf_counter()
    first_at: dict[int, float] = {}

    async def one(i: int) -> None:
        # Distinct prompts (no shared prefix) of ordinary (non-special) token ids.
        prompt = [100 + (i * 7919 + j * 104729) % (vocab - 200) for j in range(prompt_tokens)]
        async for ev in engine.generate(f"b{batch}-{i}", prompt, params):
            if ev.token_ids and i not in first_at:
                first_at[i] = time.perf_counter()

    await asyncio.gather(*(one(i) for i in range(batch)))
    return max(first_at.values()) - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompt-tokens", type=int, default=2048)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--batches", default="1,8,80")
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    cfg = EngineConfig(device=args.device, num_pages=16384, enable_prefix_cache=False)
    torch.manual_seed(0)
    runner = TimedRunner(ModelRunner(cfg, DSV4Mini(cfg.model)))
    alloc = PageAllocator(cfg.num_pages)
    scheduler = Scheduler(cfg, alloc, RadixCache(cfg.page_size, alloc), eos_token_id=-1)  # never sampled: every request runs its full length
    loop = UnifiedEngine(cfg, scheduler, runner)
    loop.start()
    engine = AsyncEngine(cfg, loop, eos_token_id=-1)  # never sampled: every request runs its full length
    print(f"machine: {os.cpu_count()} cores, torch {torch.__version__} ({torch.get_num_threads()} threads), "
          f"device {args.device}; prompt {args.prompt_tokens} tokens, {args.max_tokens} output tokens per request")
    print(f"{'batch':>5} {'out tok/s':>10} {'decode step p50':>16} {'p90':>8} {'prefill step p50':>17} "
          f"{'all first tokens':>17}")
    try:
        for b in [int(x) for x in args.batches.split(",")]:
            runner.steps.clear()
            ttft_all = asyncio.run(run_batch(engine, b, args.prompt_tokens, args.max_tokens, cfg.model.vocab_size,
                                             cfg.chunked_prefill_tokens))
            d = sorted(ms for n, pf, ms in runner.steps if n == b and pf == 0)
            pf = sorted(ms for _, p, ms in runner.steps if p)
            p50 = statistics.median(d)
            p90 = d[int(0.9 * (len(d) - 1))]
            print(f"{b:>5} {b / p50 * 1e3:>10.1f} {p50:>13.1f} ms {p90:>5.1f} ms {statistics.median(pf):>14.1f} ms "
                  f"{ttft_all:>15.1f} s   ({len(d)} full-batch decode steps)", flush=True)
    finally:
        loop.stop()


if __name__ == "__main__":
    main()
