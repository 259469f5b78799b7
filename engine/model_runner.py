"""The one bridge between the torch-free scheduler and the device: a scheduled batch in,
one sampled token per sampling entry out.

Sampling is per request: one request's sampling that raises (a seed the generator refuses,
say) fails that request alone (`RequestFailure`), the others' tokens go on. Greedy requests
share one argmax over the batch and one read back to the host.

On CUDA, a step replays a captured graph (cuda_graphs.py); steps too large for a graph, and
steps on pools with a read gate (HiCache), run the model eagerly.
"""

from __future__ import annotations

import torch

from . import cuda_graphs
from .config import EngineConfig
from .model.batch import ForwardBatch, SeqSlice
from .model.kv_pools import KVPools
from .model.model import DSV4Mini
from .request import RequestFailure


class ModelRunner:
    """Owns the model, its KV pools and the per-request sampling generators."""

    def __init__(self, cfg: EngineConfig, model: DSV4Mini) -> None:
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.model = model.to(self.device).eval()
        dtype = torch.float32 if self.device.type == "cpu" else torch.bfloat16
        mode = cuda_graphs.mode() if self.device.type == "cuda" else "0"
        self.pools = KVPools(cfg, dtype=dtype, device=self.device, scratch_page=mode != "0")
        self.graphs = (
            cuda_graphs.DecodeGraphs(
                self.model,
                self.pools,
                cfg.max_running_requests + cfg.chunked_prefill_tokens,
                decode_only=mode == "decode",
            )
            if mode != "0"
            else None
        )
        self._generators: dict[str, torch.Generator] = {}

    @torch.inference_mode()
    def __call__(self, batch) -> dict[str, int]:  # batch: scheduler.ScheduledBatch
        entries = batch.entries
        greedy: list[int] | None = None
        if self.graphs is not None and self.graphs.supports(batch):
            logits, greedy = self.graphs.run(entries)
        else:
            logits = self._eager(entries)
        if banned := [
            (i, e.req.params.constraint.banned_ids)
            for i, e in enumerate(batch.entries)
            if e.sample and e.req.params.constraint is not None and e.req.params.constraint.banned_ids
        ]:
            # A request's banned ids (tool_choice "none": no call can start) are never sampled.
            logits = logits.clone()
            for i, ids in banned:
                logits[i, list(ids)] = float("-inf")
            greedy = None
        out: dict[str, int] = {}
        failed: dict[str, BaseException] = {}
        for i, e in enumerate(entries):
            if not e.sample:
                continue
            if e.req.params.temperature <= 0.0:
                if greedy is None:
                    greedy = _argmax_rows(logits)
                out[e.req.rid] = greedy[i]
                continue
            try:
                out[e.req.rid] = self._sample(e.req, logits[i])
            except Exception as err:  # noqa: BLE001 - one request's failure is that request's, not the batch's
                failed[e.req.rid] = err
        if failed:
            raise RequestFailure(failed, out)
        return out

    def _eager(self, entries) -> torch.Tensor:
        # NOTE: copy each page table now: an abort between schedule() and postprocess()
        # replaces req.pages, and the forward must write where the scheduler reserved.
        fb = ForwardBatch([SeqSlice(list(e.token_ids), e.start_pos, list(e.req.pages)) for e in entries])
        return self.model.forward(fb, self.pools)

    def _sample(self, req, logits: torch.Tensor) -> int:
        p = req.params
        assert p.temperature > 0.0, "greedy rows take the batch's argmax"
        gen = self._generators.get(req.rid)
        if gen is None:
            gen = torch.Generator(device=logits.device)
            gen.manual_seed(p.seed if p.seed is not None else torch.seed() % (2**63))
            self._generators[req.rid] = gen
        probs = torch.softmax(logits.float() / p.temperature, dim=-1)
        if p.top_p < 1.0:
            sorted_p, idx = torch.sort(probs, descending=True)
            keep = torch.cumsum(sorted_p, dim=-1) - sorted_p < p.top_p  # always keeps the top token
            sorted_p = sorted_p * keep
            probs = torch.zeros_like(probs).scatter_(0, idx, sorted_p)
        return int(torch.multinomial(probs / probs.sum(), 1, generator=gen).item())

    def forget(self, rid: str) -> None:
        """Drop a finished or aborted request's sampling state."""
        self._generators.pop(rid, None)


def _argmax_rows(logits: torch.Tensor) -> list[int]:
    """The first index of each row's largest logit (a NaN counts as the largest, as in torch)."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        # NOTE: numpy's argmax is vectorised, torch's CPU one is not: 0.13 against 0.82 ms for
        # 80 rows of 8,192 (the same indices, first maximum and NaN alike).
        return logits.numpy().argmax(-1).tolist()
    return logits.argmax(-1).tolist()
