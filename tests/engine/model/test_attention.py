"""Attention pieces: sinks absorb mass, RoPE is relative, and the decode op matches a naive
per-sequence loop."""

from __future__ import annotations

import torch

from dsv4bench.engine.kernels.reference import softmax_with_sink, sparse_decode_attention
from dsv4bench.engine.model.attention import Attention
from dsv4bench.engine.model.rope import Rope, apply_rope

from .conftest import SMALL


def test_softmax_with_sink_leaves_the_sink_share_out():
    logits = torch.randn(3, 4, 7)
    sink = torch.tensor([0.0, 1.0, -2.0, 5.0])
    p = softmax_with_sink(logits, sink)
    mass = logits.exp().sum(-1)
    torch.testing.assert_close(p.sum(-1), mass / (mass + sink.exp()))


def test_large_sink_drives_attention_output_to_zero():
    torch.manual_seed(0)
    attn = Attention(SMALL, 1)
    x = torch.randn(2, 30, SMALL.d_model)
    rope = Rope(SMALL.rope_dim, SMALL.rope_theta, SMALL.max_context)
    out, _ = attn.forward_dense(x, rope, None)
    assert out.abs().max() > 1e-2
    with torch.no_grad():
        attn.sink.fill_(60.0)
    out, _ = attn.forward_dense(x, rope, None)
    assert out.abs().max() < 1e-12


def test_rope_is_relative_and_partial():
    rope = Rope(16, 10000.0, 512)
    q, k = torch.randn(32), torch.randn(32)
    dots = [float(rope(q, torch.tensor(p + 5)) @ rope(k, torch.tensor(p))) for p in (0, 17, 300)]
    assert max(dots) - min(dots) < 1e-4
    moved = rope(q, torch.tensor(123))
    torch.testing.assert_close(moved[16:], q[16:], atol=0, rtol=0)
    torch.testing.assert_close(moved.norm(), q.norm())


def naive_decode(q, kv_flat, win_slots, win_pos, ckv_flat, c_ids, c_pos, sink, cos, sin, scale):
    out = torch.zeros_like(q)
    for s in range(q.shape[0]):
        keys, vals = [], []
        for slot, p in zip(win_slots[s].tolist(), win_pos[s].tolist()):
            if slot >= 0:
                vals.append(kv_flat[slot])
                keys.append(apply_rope(kv_flat[slot], cos[p], sin[p]))
        for e, p in zip(c_ids[s].tolist(), c_pos[s].tolist()):
            if e >= 0:
                vals.append(ckv_flat[e])
                keys.append(apply_rope(ckv_flat[e], cos[p], sin[p]))
        K, V = torch.stack(keys), torch.stack(vals)
        for h in range(q.shape[1]):
            lg = torch.cat((K @ q[s, h] * scale, sink[h : h + 1]))
            out[s, h] = torch.softmax(lg, 0)[:-1] @ V
    return out


def decode_inputs(S=5, W=8, Kc=6, H=4, hd=32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    rope = Rope(16, 10000.0, 256)
    kv_flat, ckv_flat = torch.randn(100, hd, generator=gen), torch.randn(40, hd, generator=gen)
    win_slots = torch.randint(0, 100, (S, W), generator=gen)
    win_slots[0, :3] = -1
    win_pos = torch.randint(0, 200, (S, W), generator=gen)
    c_ids = torch.randint(0, 40, (S, Kc), generator=gen)
    c_ids[1, 4:] = -1
    c_ids[2, :] = -1
    c_pos = torch.randint(0, 200, (S, Kc), generator=gen)
    q = torch.randn(S, H, hd, generator=gen)
    sink = torch.randn(H, generator=gen)
    return (q, kv_flat, win_slots, win_pos, ckv_flat, c_ids, c_pos, sink, rope.cos, rope.sin, hd**-0.5)


def test_reference_decode_matches_naive_loop():
    args = decode_inputs()
    torch.testing.assert_close(sparse_decode_attention(*args), naive_decode(*args), atol=1e-5, rtol=0)
