"""kernels/moe_route.py against MoE.route and static_moe's counting sort: the same experts, gates
and expert order. On a GPU the kernel runs as compiled; on CPU, Triton's interpreter runs the
same kernel (in a subprocess: the interpreter is chosen when the kernel is defined)."""

from __future__ import annotations

import pytest
import torch

from dsv4bench.engine.model.static_moe import _expert_order, top_k_by_argmax

# (rows, experts, per token, dtype, score): a decode batch of the 1B config, rows over several
# tiles, DSV4's 6 of many, a single row, softmax scores
CASES = [
    (256, 8, 2, torch.bfloat16, "sigmoid"),
    (1100, 16, 6, torch.bfloat16, "sigmoid"),
    (1, 8, 2, torch.bfloat16, "sigmoid"),
    (37, 8, 3, torch.float32, "softmax"),
    (300, 64, 6, torch.float32, "sigmoid"),
    (9, 4, 4, torch.bfloat16, "softmax"),
]


def routed(logits: torch.Tensor, bias: torch.Tensor, k: int, score: str):
    """What static_moe computed before the kernel: MoE.route's arithmetic, then the sort."""
    scores = logits.sigmoid() if score == "sigmoid" else logits.softmax(-1)
    experts = top_k_by_argmax(scores + bias, k)
    gates = scores.gather(-1, experts)
    order, _, offs = _expert_order(logits.shape[1], experts)
    return order, order // k, (gates / gates.sum(-1, keepdim=True)).reshape(-1), offs


def check_cases(device: str) -> None:
    from dsv4bench.engine.kernels import moe_route

    gen = torch.Generator().manual_seed(0)
    for N, E, k, dtype, score in CASES:
        logits = torch.randn(N, E + 3, generator=gen)[:, :E].to(dtype)  # rows not contiguous
        logits[: N // 3, : E // 2] = 0.25  # exact ties: the first column wins, as argmax's
        bias = (torch.randn(E, generator=gen) * 0.05).to(dtype)
        bias[: E // 2] = bias[0]
        want = routed(logits, bias, k, score)
        got = moe_route.route(logits.to(device), bias.to(device), k, sigmoid=score == "sigmoid")
        case = (N, E, k, dtype, score)
        for name, g, w in zip(("order", "tok", "gates", "offs"), got, want):
            g = g.cpu()
            assert g.shape == w.shape, (case, name)
            if name == "gates" and dtype == torch.float32:  # the sums' order: the last bit
                torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-7, msg=f"{case} gates")
            else:
                assert torch.equal(g.to(w.dtype), w), (case, name, (g.to(w.dtype) != w).sum())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_routing_kernel_matches_the_route_and_sort_on_the_gpu():
    from .conftest import triton_kernels  # here: the file also runs as a script

    triton_kernels("moe_route")
    check_cases("cuda")


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="the GPU test runs the kernel itself (and Triton 3.6's interpreter cannot run this kernel)",
)
def test_routing_kernel_matches_the_route_and_sort_in_tritons_interpreter():
    from .conftest import run_in_tritons_interpreter  # here: the file also runs as a script

    run_in_tritons_interpreter(__file__)


if __name__ == "__main__":
    check_cases("cpu")
    print("all cases agree")
