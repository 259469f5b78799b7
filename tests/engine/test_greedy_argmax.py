"""The greedy token of each row (model_runner._argmax_rows) is torch.argmax's, whichever way it
is computed: the first largest logit, a NaN counting as the largest."""

from __future__ import annotations

import torch

from dsv4bench.engine.model_runner import _argmax_rows


def test_argmax_rows_is_torch_argmax_on_ties_nan_and_banned_rows() -> None:
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        x = torch.randint(-3, 4, (16, 97), generator=g).float()  # many exact ties
        x[0] = float("-inf")  # every token banned
        x[1, 10] = x[1, 50] = float("nan")
        x[2, 5] = float("inf")
        x[3] = 1.0
        assert _argmax_rows(x) == x.argmax(-1).tolist()
    bf = torch.randn(4, 33, generator=g).to(torch.bfloat16)
    assert _argmax_rows(bf) == bf.argmax(-1).tolist()
