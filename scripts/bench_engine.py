"""DSV4-mini serving throughput: output tokens/s and per-step latency at batch 1, 8 and 80.

Each batch size runs `batch` concurrent requests through the real engine loop (scheduler,
model runner, default model config, seeded random weights), each with its own prompt of
--prompt-tokens tokens and --max-tokens output tokens. Reported per batch size:
  - output tokens/s over the decode phase (all prompts done, every request decoding);
  - per-step latency, median and p90, of decode steps and of prefill steps;
  - time to first token of the batch (all prompts prefilled, chunked).

    python scripts/bench_engine.py [--prompt-tokens 2048 --max-tokens 32 --batches 1,8,80]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsv4bench.engine.config import EngineConfig  # noqa: E402
from dsv4bench.engine.engine_loop import AsyncEngine, EngineLoop  # noqa: E402
from dsv4bench.engine.memory import PageAllocator  # noqa: E402
from dsv4bench.engine.model.model import DSV4Mini  # noqa: E402
from dsv4bench.engine.model_runner import ModelRunner  # noqa: E402
from dsv4bench.engine.radix_cache import RadixCache  # noqa: E402
from dsv4bench.engine.request import SamplingParams  # noqa: E402
from dsv4bench.engine.scheduler import Scheduler  # noqa: E402


class TimedRunner:
    """Wraps the model runner to time each step and tell decode steps from prefill steps."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.decode_ms: list[float] = []
        self.prefill_ms: list[float] = []

    def __call__(self, batch):
        t0 = time.perf_counter()
        out = self.runner(batch)
        ms = (time.perf_counter() - t0) * 1e3
        (self.prefill_ms if batch.num_prefill_tokens else self.decode_ms).append(ms)
        return out

    def forget(self, rid: str) -> None:
        self.runner.forget(rid)


async def run_batch(engine: AsyncEngine, batch: int, prompt_tokens: int, max_tokens: int, vocab: int) -> dict:
    eos = engine.eos_token_id
    first_at: list[float] = []
    decode_tokens = 0
    start = time.perf_counter()
    all_prefilled = asyncio.Event()
    decode_start: list[float] = []

    async def one(i: int) -> None:
        nonlocal decode_tokens
        # Distinct prompts (no shared prefix) of ordinary (non-special) token ids.
        prompt = [100 + (i * 7919 + j * 104729) % (vocab - 200) for j in range(prompt_tokens)]
        prompt = [t if t != eos else t + 1 for t in prompt]
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
        async for ev in engine.generate(f"b{batch}-{i}", prompt, params):
            if ev.token_ids:
                if len(first_at) < batch and i not in seen:
                    seen.add(i)
                    first_at.append(time.perf_counter())
                    if len(first_at) == batch:
                        decode_start.append(time.perf_counter())
                        all_prefilled.set()
                elif all_prefilled.is_set():
                    decode_tokens += len(ev.token_ids)

    seen: set[int] = set()
    await asyncio.gather(*(one(i) for i in range(batch)))
    end = time.perf_counter()
    decode_s = end - decode_start[0] if decode_start else float("nan")
    return {"ttft_all_s": (first_at[-1] - start) if first_at else float("nan"),
            "decode_tok_s": decode_tokens / decode_s if decode_s > 0 else float("nan")}


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
    scheduler = Scheduler(cfg, alloc, RadixCache(cfg.page_size, alloc), eos_token_id=1)
    loop = EngineLoop(cfg, scheduler, runner)
    loop.start()
    engine = AsyncEngine(cfg, loop, eos_token_id=1)
    print(f"machine: {os.cpu_count()} cores, torch {torch.__version__} ({torch.get_num_threads()} threads), "
          f"device {args.device}; prompt {args.prompt_tokens} tokens, {args.max_tokens} output tokens per request")
    print(f"{'batch':>5} {'out tok/s':>10} {'decode step p50':>16} {'p90':>8} {'prefill step p50':>17} {'TTFT(all)':>10}")
    try:
        for b in [int(x) for x in args.batches.split(",")]:
            runner.decode_ms.clear()
            runner.prefill_ms.clear()
            r = asyncio.run(run_batch(engine, b, args.prompt_tokens, args.max_tokens, cfg.model.vocab_size))
            d = sorted(runner.decode_ms)
            pf = sorted(runner.prefill_ms)
            p90 = d[int(0.9 * (len(d) - 1))] if d else float("nan")
            print(f"{b:>5} {r['decode_tok_s']:>10.1f} {statistics.median(d):>13.1f} ms {p90:>5.1f} ms "
                  f"{statistics.median(pf):>14.1f} ms {r['ttft_all_s']:>8.1f} s", flush=True)
    finally:
        loop.stop()


if __name__ == "__main__":
    main()
