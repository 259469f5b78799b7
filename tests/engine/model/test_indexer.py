"""Lightning indexer: selection semantics, fp8 vs bf16 index keys, and its training signal."""

from __future__ import annotations

import pytest
import torch

from dsv4bench.engine.kernels.reference import indexer_scores, indexer_topk, topk_blocks
from dsv4bench.engine.model import KVPools
from dsv4bench.engine.model.indexer import Indexer
from dsv4bench.engine.model.kv_pools import FP8_MAX, quantize_index_k, roundtrip_index_k

from .conftest import SMALL, engine_cfg


def exact_scores(q: torch.Tensor, w: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """float64, loop over heads: an independent formula for sum_h w_h relu(q_h . k)."""
    q, w, k = q.double(), w.double(), k.double()
    out = torch.zeros(q.shape[0], k.shape[0], dtype=torch.float64)
    for h in range(q.shape[1]):
        out += w[:, h : h + 1] * (q[:, h] @ k.t()).clamp(min=0)
    return out


def pool_with_keys(keys: torch.Tensor, mode: str) -> tuple[KVPools, torch.Tensor]:
    """Write keys [n, index_dim] into layer 0's index-K pool at scattered entries."""
    pools = KVPools(engine_cfg(mode))
    gen = torch.Generator().manual_seed(0)
    entries = torch.randperm(pools.idx_flat(0)[0].shape[0], generator=gen)[: keys.shape[0]]
    pools.write_index_k(0, entries, keys)
    return pools, entries


def random_inputs(n_q: int, n_b: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    H, D = SMALL.index_heads, SMALL.index_dim
    q = torch.randn(n_q, H, D, generator=gen)
    w = torch.randn(n_q, H, generator=gen)
    k = torch.randn(n_b, D, generator=gen) * torch.rand(n_b, 1, generator=gen) * 4
    return q, w, k


def test_bf16_selection_equals_dense_topk_over_exact_scores():
    q, w, k = random_inputs(64, 200, seed=1)
    pools, entries = pool_with_keys(k, "bf16")
    n_elig = torch.randint(1, 201, (64,))
    k_flat, s_flat = pools.idx_flat(0)
    sel = indexer_topk(q[None], w[None], k_flat, s_flat, entries[None], n_elig[None], 16)[0]
    exact = exact_scores(q, w, roundtrip_index_k(k, "bf16"))
    for i in range(64):
        n = int(n_elig[i])
        # the documented tie rule: exact zeros (all heads' dots <= 0) rank by recency
        order = sorted(range(n), reverse=True, key=lambda b: (float(exact[i, b]), b if exact[i, b] == 0 else 0))
        want = set(order[:16])
        got = [b for b in sel[i].tolist() if b >= 0]
        assert set(got) == want and len(got) == len(want)
        assert all(b == -1 for b in sel[i, len(got) :].tolist())


def test_fp8_selection_agrees_with_bf16():
    """Tolerance: on random inputs (200 blocks, top-16) the fp8 and bf16 top-k sets overlap in
    >= 90% of their blocks on average, and every fp8 score is within the bound implied by e4m3
    rounding: |k8_i - k_i| <= |k_i| / 16 + absmax / 448 * 2^-10 elementwise (half an ulp of a
    3-bit mantissa, or of the subnormal step), so |s8 - s| <= sum_h |w_h| * |q_h| . err."""
    q, w, k = random_inputs(64, 200, seed=2)
    n_elig = torch.full((64,), 200)
    sels = {}
    for mode in ("fp8", "bf16"):
        pools, entries = pool_with_keys(k, mode)
        k_flat, s_flat = pools.idx_flat(0)
        sels[mode] = indexer_topk(q[None], w[None], k_flat, s_flat, entries[None], n_elig[None], 16)[0]
    overlap = [len(set(a.tolist()) & set(b.tolist())) / 16 for a, b in zip(sels["fp8"], sels["bf16"])]
    assert sum(overlap) / len(overlap) >= 0.9
    err = k.abs() / 16 + k.abs().amax(-1, keepdim=True) / FP8_MAX * 2.0**-10
    bound = torch.einsum("qh,qhd,bd->qb", w.abs().double(), q.abs().double(), err.double())
    diff = (exact_scores(q, w, roundtrip_index_k(k, "fp8")) - exact_scores(q, w, k)).abs()
    assert bool((diff <= bound + 1e-9).all())


def test_fp8_quantization_uses_per_entry_scale():
    k = torch.randn(5, 16) * torch.tensor([1e-3, 1.0, 10.0, 1e3, 0.0]).unsqueeze(1)
    stored, scale = quantize_index_k(k, "fp8")
    assert stored.dtype == torch.float8_e4m3fn and scale is not None and scale.shape == (5,)
    back = roundtrip_index_k(k, "fp8")
    assert bool(((back - k).abs() <= k.abs() / 16 + scale.unsqueeze(1) * 2.0**-9).all())
    assert bool((back[4] == 0).all())


def test_topk_blocks_pads_and_never_picks_ineligible():
    scores = torch.tensor([[3.0, 2.0, 1.0, 9.0], [0.5, 0.7, 0.0, 0.0]])
    sel = topk_blocks(scores, torch.tensor([2, 4]), 3)
    assert sel[0].tolist() == [0, 1, -1]  # block 3 scores 9 but is not complete yet
    assert sel[1].tolist() == [1, 0, 3]  # zero ties: the most recent block wins


def test_scores_chunking_matches_unchunked(monkeypatch):
    q, w, k = random_inputs(50, 30, seed=3)
    whole = indexer_scores(q[None], w[None], k[None])
    import dsv4bench.engine.kernels.reference as ref

    monkeypatch.setattr(ref, "_SCORE_CHUNK", 500)
    torch.testing.assert_close(ref.indexer_scores(q[None], w[None], k[None]), whole)
    torch.testing.assert_close(whole[0].double(), exact_scores(q, w, k), atol=1e-4, rtol=0)


@pytest.mark.parametrize("mode", ["fp8", None])
def test_distillation_loss_trains_only_the_indexer(mode):
    """The LM loss never reaches the indexer (top-k has no gradient); the distillation loss
    reaches only the indexer."""
    from dsv4bench.engine.model import DSV4Mini

    torch.manual_seed(0)
    m = DSV4Mini(SMALL)
    ids = torch.randint(0, 512, (2, 40))
    logits, aux = m.forward_dense(ids, index_k_dtype=mode, return_indexer_loss=True)
    assert aux.item() > 0
    idx_params = {n for n, _ in m.named_parameters() if ".indexer." in n}
    assert idx_params
    lm_grads = torch.autograd.grad(
        logits.logsumexp(-1).mean(), list(m.parameters()), allow_unused=True, retain_graph=True
    )
    for (n, _), g in zip(m.named_parameters(), lm_grads):
        assert (g is None or not g.any()) == (n in idx_params), n
    aux_grads = torch.autograd.grad(aux, list(m.parameters()), allow_unused=True)
    for (n, _), g in zip(m.named_parameters(), aux_grads):
        assert (g is not None and bool(g.any())) == (n in idx_params), n
        assert g is None or bool(torch.isfinite(g).all())


def test_indexer_queries_shapes():
    ix = Indexer(SMALL.d_model, SMALL.head_dim, 4, 16, 4)
    q, w = ix.queries(torch.randn(3, 7, SMALL.d_model))
    assert q.shape == (3, 7, 4, 16) and w.shape == (3, 7, 4)
