"""forward_dense: batched [B, T] equals per-row [T], and it is differentiable (training)."""

from __future__ import annotations

import torch

from dsv4bench.engine.model import DSV4Mini

from .conftest import SMALL


def test_batched_rows_equal_single_rows(model):
    ids = torch.randint(0, 512, (3, 70), generator=torch.Generator().manual_seed(0))
    batched = model.forward_dense(ids).detach()
    assert batched.shape == (3, 70, 512)
    for b in range(3):
        torch.testing.assert_close(batched[b], model.forward_dense(ids[b]).detach(), atol=1e-4, rtol=0)


def test_lm_loss_backpropagates_to_the_main_model():
    torch.manual_seed(0)
    m = DSV4Mini(SMALL)
    ids = torch.randint(0, 512, (2, 48))
    logits = m.forward_dense(ids[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 512), ids[:, 1:].reshape(-1))
    loss.backward()
    for name, p in m.named_parameters():
        if ".indexer." in name:
            assert p.grad is None
        else:
            assert p.grad is not None and torch.isfinite(p.grad).all(), name
    assert m.blocks[1].attn.compressor.gate.weight.grad.abs().sum() > 0
    assert m.blocks[0].attn.sink.grad.abs().sum() > 0


def test_causality():
    """Changing a later token never changes earlier logits."""
    torch.manual_seed(0)
    m = DSV4Mini(SMALL).eval()
    ids = torch.randint(0, 512, (60,))
    other = ids.clone()
    other[40] = (other[40] + 1) % 512
    a, b = m.forward_dense(ids).detach(), m.forward_dense(other).detach()
    torch.testing.assert_close(a[:40], b[:40], atol=0, rtol=0)
    assert not torch.allclose(a[40:], b[40:])
