"""Per-step latency of DSV4Mini.forward on the default config (random weights, pools filled
with random KV so that no prefill is needed to set up long contexts).

    python scripts/bench_model.py [--steps N] [--device cpu|cuda]

Prints the median (and min) over several steps for decode batches of 1, 8 and 80 sequences at
contexts of 2-4k tokens, a 2048-token prefill chunk (from position 0, and after an 8k prefix),
and a mixed step (79 decodes + one 2048-token chunk). On a GPU, `bench_decode.py` times the
graph-replayed step against the bytes it reads.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from dsv4bench.engine.config import EngineConfig, ModelConfig
from dsv4bench.engine.model.batch import ForwardBatch, SeqSlice
from dsv4bench.engine.model.kv_pools import KVPools
from dsv4bench.engine.model.model import DSV4Mini


class Pages:
    """A trivial page allocator for the benchmark (pages handed out in a shuffled order)."""

    def __init__(self, num_pages: int, seed: int) -> None:
        self.free = list(range(num_pages))
        random.Random(seed).shuffle(self.free)

    def take(self, n: int) -> list[int]:
        assert n <= len(self.free)
        out, self.free = self.free[:n], self.free[n:]
        return out


def timed(fn, steps: int, sync: bool) -> tuple[float, float]:
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        if sync:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3, min(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--index-k-dtype", default="fp8", choices=["fp8", "bf16"])
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    cfg = EngineConfig(model=ModelConfig(), device=args.device, index_k_dtype=args.index_k_dtype)
    torch.manual_seed(0)
    model = DSV4Mini(cfg.model).to(args.device, dtype).eval()
    pools = KVPools(cfg, dtype=dtype, device=args.device)
    alloc = Pages(cfg.num_pages, seed=0)
    P, sync = cfg.page_size, args.device.startswith("cuda")
    rng = random.Random(0)
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"DSV4Mini default config: {n_params / 1e6:.2f}M parameters, "
        f"{pools.bytes_per_page()} bytes/page, threads={torch.get_num_threads()}, "
        f"device={args.device}, dtype={args.dtype}, index_k={args.index_k_dtype}"
    )

    # long-lived decode sequences with 2-4k tokens of context
    ctx = [rng.randint(2048, 4096) for _ in range(80)]
    tables = [alloc.take((c + 64) // P + 2) for c in ctx]
    pools.fill_random([p for t in tables for p in t])
    pos = list(ctx)

    def decode(n: int) -> None:
        seqs = [SeqSlice([rng.randrange(cfg.model.vocab_size)], pos[i], tables[i]) for i in range(n)]
        model(ForwardBatch(seqs), pools)
        for i in range(n):  # advance within the pages reserved above
            pos[i] = ctx[i] + (pos[i] - ctx[i] + 1) % 48

    for n in (1, 8, 80):
        decode(n)  # warm-up
        med, best = timed(lambda: decode(n), args.steps, sync)
        print(f"decode batch {n:3d} (ctx 2-4k): median {med:7.1f} ms  min {best:7.1f} ms")

    chunk = [rng.randrange(cfg.model.vocab_size) for _ in range(2048)]
    for prefix in (0, 8192):
        table = alloc.take((prefix + 2048) // P)
        pools.fill_random(table)
        batch = ForwardBatch([SeqSlice(chunk, prefix, table)])
        model(batch, pools)
        med, best = timed(lambda: model(batch, pools), max(3, args.steps // 2), sync)
        print(f"prefill 2048 tokens after {prefix:5d}: median {med:7.1f} ms  min {best:7.1f} ms")

    table = alloc.take((4096 + 2048) // P)
    mixed = ForwardBatch([SeqSlice([1], pos[i], tables[i]) for i in range(79)] + [SeqSlice(chunk, 4096, table)])
    model(mixed, pools)
    med, best = timed(lambda: model(mixed, pools), max(3, args.steps // 2), sync)
    print(f"mixed 79 decodes + 2048 prefill: median {med:7.1f} ms  min {best:7.1f} ms")


if __name__ == "__main__":
    main()
