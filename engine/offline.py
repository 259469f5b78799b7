"""Prompts served in-process, through the scheduler and the model runner the server uses but
without HTTP: each prompt's greedy tokens and the logits behind them. For tests that hold what
the shipped model says and for scripts that probe it where it serves (chunked prefill, paged
sparse attention), not through the training path's dense forward."""

from __future__ import annotations

import torch

from .config import EngineConfig
from .memory import PageAllocator
from .model.model import DSV4Mini
from .model_runner import ModelRunner
from .radix_cache import RadixCache
from .request import Request, SamplingParams
from .scheduler import Scheduler


def greedy_answers(
    model: DSV4Mini, prompts: list[list[int]], max_tokens: int, cfg: EngineConfig | None = None
) -> list[tuple[list[int], list[torch.Tensor]]]:
    """Each prompt's `max_tokens` greedy tokens (EOS ignored) and, per token, the logits row it
    was chosen from, all served together in one engine."""
    cfg = cfg or EngineConfig(num_pages=2048)
    runner = ModelRunner(cfg, model)
    alloc = PageAllocator(cfg.num_pages)
    scheduler = Scheduler(cfg, alloc, RadixCache(cfg.page_size, alloc), eos_token_id=-1)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    reqs = [Request(f"p{i}", list(p), params) for i, p in enumerate(prompts)]
    for r in reqs:
        scheduler.add(r)
    steps: list[torch.Tensor] = []
    forward = runner.model.forward
    runner.model.forward = lambda *a, **kw: steps.append(forward(*a, **kw)) or steps[-1]
    try:
        rows: dict[str, list[torch.Tensor]] = {r.rid: [] for r in reqs}
        while scheduler.has_work:
            batch = scheduler.schedule()
            assert batch is not None, "the scheduler has work but formed no batch"
            sampled = runner(batch)
            step = steps.pop()
            for i, e in enumerate(batch.entries):
                if e.sample:
                    rows[e.req.rid].append(step[i])
            scheduler.postprocess(batch, sampled)
    finally:
        del runner.model.forward  # the instance attribute goes; the class's forward is back
    return [(r.output_ids, rows[r.rid]) for r in reqs]
