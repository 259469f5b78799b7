"""MoE routing: hash routing in the first layer(s), selection bias steers choice only."""

from __future__ import annotations

import torch

from dsv4bench.engine.model.moe import MoE, hash_experts

from .conftest import SMALL


def test_hash_routing_is_a_function_of_the_token_id_only():
    torch.manual_seed(0)
    moe = MoE(SMALL, layer=0)
    assert moe.hashed
    ids = torch.tensor([5, 77, 5, 300, 77, 511, 0])
    e1, _ = moe.route(torch.randn(7, SMALL.d_model), ids)
    e2, _ = moe.route(torch.randn(7, SMALL.d_model) * 10, ids)
    assert torch.equal(e1, e2)
    assert torch.equal(e1[0], e1[2]) and torch.equal(e1[1], e1[4])
    assert torch.equal(e1, hash_experts(ids, SMALL.n_experts, SMALL.experts_per_token))
    with torch.no_grad():
        moe.selection_bias += torch.tensor([100.0, 0, 0, 0])  # the bias plays no part either
    assert torch.equal(moe.route(torch.randn(7, SMALL.d_model), ids)[0], e1)


def test_hash_routing_is_fixed_and_spread():
    ids = torch.arange(4096)
    e = hash_experts(ids, 8, 2)
    assert bool((e[:, 0] != e[:, 1]).all())
    counts = torch.bincount(e.flatten(), minlength=8).float()
    assert counts.min() > 0.8 * counts.mean()  # roughly balanced over a vocabulary
    assert hash_experts(torch.tensor([123]), 8, 2).tolist() == e[123:124].tolist()


def test_selection_bias_changes_choice_not_gate_normalisation():
    torch.manual_seed(1)
    moe = MoE(SMALL, layer=1)
    assert not moe.hashed
    x = torch.randn(64, SMALL.d_model)
    ids = torch.zeros(64, dtype=torch.long)
    before, g_before = moe.route(x, ids)
    with torch.no_grad():
        moe.selection_bias.copy_(torch.tensor([5.0, 0.0, 0.0, 0.0]))
    after, g_after = moe.route(x, ids)
    assert not torch.equal(before, after) and bool((after == 0).any(-1).all())
    scores = (x @ moe.router.t()).sigmoid()
    for e, g in ((before, g_before), (after, g_after)):
        torch.testing.assert_close(g.sum(-1), torch.ones(64))
        raw = scores.gather(-1, e)
        torch.testing.assert_close(g, raw / raw.sum(-1, keepdim=True))


def test_moe_forward_equals_per_token_loop():
    torch.manual_seed(2)
    moe = MoE(SMALL, layer=1)
    x = torch.randn(9, SMALL.d_model)
    ids = torch.randint(0, 512, (9,))
    experts, gates = moe.route(x, ids)
    want = moe.shared(x)
    for t in range(9):
        for e, g in zip(experts[t].tolist(), gates[t]):
            gate, up = (x[t] @ moe.w_in[e]).chunk(2)
            want[t] = want[t] + g * ((torch.nn.functional.silu(gate) * up) @ moe.w_out[e])
    torch.testing.assert_close(moe(x, ids), want, atol=1e-5, rtol=0)


def test_balancing_update_moves_bias_toward_underloaded_experts():
    moe = MoE(SMALL, layer=1)
    moe.update_selection_bias(torch.tensor([10, 0, 5, 5]), step=0.1)
    torch.testing.assert_close(moe.selection_bias, torch.tensor([-0.1, 0.1, 0.0, 0.0]))


def test_routing_by_rounds_of_argmax_chooses_topks_experts_and_gates():
    # the top-k a GPU step routes with (static_moe.top_k_by_argmax) against torch.topk
    from dsv4bench.engine.model.static_moe import top_k_by_argmax

    torch.manual_seed(0)
    moe = MoE(SMALL, layer=SMALL.n_layers - 1)
    assert not moe.hashed
    with torch.no_grad():
        moe.selection_bias += torch.randn(SMALL.n_experts)
    x, ids = torch.randn(64, SMALL.d_model), torch.arange(64)
    e_topk, g_topk = moe.route(x, ids)
    e_rounds, g_rounds = moe.route(x, ids, top_k_by_argmax)
    assert torch.equal(e_rounds, e_topk) and torch.equal(g_rounds, g_topk)
    scores = torch.tensor([[0.1, 0.9, 0.5, 0.7]])
    assert top_k_by_argmax(scores, 3).tolist() == [[1, 3, 2]]
