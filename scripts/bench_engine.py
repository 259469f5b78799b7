"""DSV4-mini serving throughput: output tokens/s and per-step latency at each --batches size.

Each batch size runs `batch` concurrent requests through the real engine loop (scheduler,
model runner, default model config, seeded random weights), each with its own prompt of
--prompt-tokens tokens. Requests generate long enough that, once every prompt is prefilled,
--max-tokens steps decode the whole batch at once. Reported per batch size:
  - per-step latency (median, p90) of the steps that decode all `batch` requests and nothing
    else, and the output tokens/s that gives (batch / step time);
  - median latency of the steps that carry a prefill chunk (chunked prefill, mixed with decodes);
  - time until every request of the batch has its first token.
A batch that cannot be formed (its requests would outgrow the model's context) is refused, with
the reason, before anything runs; a request the engine fails stops the run with its error.

    python scripts/bench_engine.py [--prompt-tokens 2048 --max-tokens 32 --batches 1,8,80] [--device cuda]

On CUDA, steps replay CUDA graphs (engine/cuda_graphs.py; DSV4_CUDA_GRAPHS=decode for decode-only
steps, =0 for none); the last line says which graphs were captured, in how long, and how often
they replayed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

from dsv4bench.engine.cpu_threads import on_passing_thread, set_openmp_spin

set_openmp_spin()  # as the engine's processes do, before torch loads (engine/cpu_threads.py)
import torch


from dsv4bench.engine.config import EngineConfig
from dsv4bench.engine.unified_engine import AsyncEngine, UnifiedEngine
from dsv4bench.engine.memory import PageAllocator
from bench_decode import parse_batches
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


def output_tokens(batch: int, prompt_tokens: int, max_tokens: int, chunk: int) -> int:
    """What each request of a batch generates: the first request decodes during every later
    prefill step, so it must outlast them all and still decode --max-tokens with the whole batch."""
    return -(-batch * prompt_tokens // chunk) + batch + max_tokens


def check_sizes(batches: list[int], prompt_tokens: int, max_tokens: int, cfg: EngineConfig) -> None:
    """Refuse, in one line, what could not give a full-batch figure: empty prompts or outputs, and
    a batch whose requests would not fit the model's context (the engine would stop them at it,
    before their --max-tokens steps with the whole batch)."""
    if prompt_tokens < 1 or max_tokens < 1:
        raise SystemExit(f"--prompt-tokens and --max-tokens take at least 1; got {prompt_tokens} and {max_tokens}")
    context = cfg.model.max_context
    for b in batches:
        tokens = prompt_tokens + output_tokens(b, prompt_tokens, max_tokens, cfg.chunked_prefill_tokens)
        if tokens > context:
            raise SystemExit(
                f"batch {b} cannot be formed: each request needs {prompt_tokens} prompt tokens and "
                f"{tokens - prompt_tokens} output tokens (it decodes through every later prefill step, "
                f"then --max-tokens with the whole batch), {tokens} in all, over the model's context "
                f"of {context}; use a smaller batch or --prompt-tokens"
            )


def check_device(device: str) -> None:
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device {device}: torch {torch.__version__} sees no CUDA device here")


def engine_config(device: str, batches: list[int], prompt_tokens: int, max_tokens: int) -> EngineConfig:
    """A config that can hold the largest batch whole: a running slot for each request and the
    pages of all of them at once (else no step could decode the whole batch)."""
    base = EngineConfig(device=device, enable_prefix_cache=False)
    pages = max(
        b
        * -(
            -(prompt_tokens + output_tokens(b, prompt_tokens, max_tokens, base.chunked_prefill_tokens))
            // base.page_size
        )
        for b in batches
    )
    return EngineConfig(
        device=device,
        enable_prefix_cache=False,
        max_running_requests=max(batches),
        num_pages=max(16384, pages + max(batches)),
    )


async def run_batch(
    engine: AsyncEngine, batch: int, prompt_tokens: int, max_tokens: int, vocab: int, chunk: int
) -> float:
    """Run one batch; returns seconds until every request had its first token."""
    params = SamplingParams(
        max_tokens=output_tokens(batch, prompt_tokens, max_tokens, chunk), temperature=0.0, stop_token_ids=()
    )
    start = time.perf_counter()
    first_at: dict[int, float] = {}
    errors: list[str] = []

    async def one(i: int) -> None:
        # Distinct prompts (no shared prefix) of ordinary (non-special) token ids.
        prompt = [100 + (i * 7919 + j * 104729) % (vocab - 200) for j in range(prompt_tokens)]
        async for ev in engine.generate(f"b{batch}-{i}", prompt, params):
            if ev.token_ids and i not in first_at:
                first_at[i] = time.perf_counter()
            if ev.error:
                errors.append(ev.error)

    await asyncio.gather(*(one(i) for i in range(batch)))
    if errors:  # the engine failed requests: a figure over the rest would be no batch's
        raise SystemExit(
            f"batch {batch}: the engine failed {len(errors)} of {batch} requests, the first with: {errors[0]}"
        )
    return max(first_at.values()) - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompt-tokens", type=int, default=2048)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--batches", default="1,8,80")
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    batches = parse_batches(args.batches)
    cfg = engine_config(args.device, batches, args.prompt_tokens, args.max_tokens)
    check_sizes(batches, args.prompt_tokens, args.max_tokens, cfg)
    check_device(args.device)
    torch.manual_seed(0)
    # built as the engine builds it: off the loop's thread, on one that ends (engine/cpu_threads.py)
    runner = TimedRunner(on_passing_thread(lambda: ModelRunner(cfg, DSV4Mini(cfg.model))))
    alloc = PageAllocator(cfg.num_pages)
    scheduler = Scheduler(
        cfg, alloc, RadixCache(cfg.page_size, alloc), eos_token_id=-1
    )  # never sampled: every request runs its full length
    loop = UnifiedEngine(cfg, scheduler, runner)
    loop.start()
    engine = AsyncEngine(cfg, loop, eos_token_id=-1)  # never sampled: every request runs its full length
    gpu = f" ({torch.cuda.get_device_name()})" if args.device.startswith("cuda") else ""
    print(
        f"machine: {os.cpu_count()} cores, torch {torch.__version__} ({torch.get_num_threads()} threads), "
        f"device {args.device}{gpu}; prompt {args.prompt_tokens} tokens, {args.max_tokens} output tokens per request; "
        f"{cfg.num_pages} pages of {cfg.page_size} tokens, {cfg.max_running_requests} running slots"
    )
    print(
        f"{'batch':>5} {'out tok/s':>10} {'decode step p50':>16} {'p90':>8} {'prefill step p50':>17} "
        f"{'all first tokens':>17}"
    )
    try:
        for b in batches:
            runner.steps.clear()
            ttft_all = asyncio.run(
                run_batch(
                    engine, b, args.prompt_tokens, args.max_tokens, cfg.model.vocab_size, cfg.chunked_prefill_tokens
                )
            )
            d = sorted(ms for n, pf, ms in runner.steps if n == b and pf == 0)
            pf = sorted(ms for _, p, ms in runner.steps if p)
            if not d:  # say why rather than fail on an empty median
                widest = max((n for n, _, _ in runner.steps), default=0)
                print(
                    f"{b:>5} no step decoded all {b} requests at once (at most {widest}): the scheduler did not "
                    f"hold the batch whole ({cfg.max_running_requests} running slots, {cfg.num_pages} pages)",
                    flush=True,
                )
                continue
            p50 = statistics.median(d)
            p90 = d[int(0.9 * (len(d) - 1))]
            print(
                f"{b:>5} {b / p50 * 1e3:>10.1f} {p50:>13.1f} ms {p90:>5.1f} ms {statistics.median(pf) if pf else float('nan'):>14.1f} ms "
                f"{ttft_all:>15.1f} s   ({len(d)} full-batch decode steps)",
                flush=True,
            )
    finally:
        loop.stop()
    graphs = runner.runner.graphs
    if graphs is not None:
        print(
            f"CUDA graphs: {graphs.replays} replays of {len(graphs.captured())} captured "
            f"(rows, page-table width) buckets, captured in {graphs.capture_s:.1f} s: {graphs.captured()}"
        )


if __name__ == "__main__":
    main()
