"""Shared fixtures: a small DSV4-mini where windows, blocks and top-k matter at ~100-200 tokens
(window 16, HCA rate 8, CSA rate 2, top-4 of the CSA blocks, pages of 16 tokens); and the run
of a kernel test file in Triton's interpreter."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest
import torch

from dsv4bench.engine.config import EngineConfig, ModelConfig
from dsv4bench.engine.model import DSV4Mini, ForwardBatch, KVPools, SeqSlice

SMALL = ModelConfig(
    vocab_size=512,
    d_model=64,
    n_layers=4,
    n_heads=4,
    head_dim=32,
    rope_dim=16,
    window=16,
    csa_rate=2,
    hca_rate=8,
    index_heads=4,
    index_dim=16,
    index_topk=4,
    n_experts=4,
    experts_per_token=2,
    expert_dim=64,
    shared_expert_dim=64,
    max_context=1024,
)


def engine_cfg(index_k_dtype: str = "fp8", num_pages: int = 128, model: ModelConfig = SMALL) -> EngineConfig:
    return EngineConfig(model=model, page_size=16, num_pages=num_pages, index_k_dtype=index_k_dtype)


@pytest.fixture(scope="module")
def model() -> DSV4Mini:
    torch.manual_seed(0)
    return DSV4Mini(SMALL).eval()


def random_tokens(n: int, seed: int, vocab: int = SMALL.vocab_size) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


def run_chunks(
    model: DSV4Mini, pools: KVPools, tokens: list[int], chunks: list[int], page_table: list[int]
) -> torch.Tensor:
    """Feed `tokens` through forward() in chunks of the given sizes; logits of every token."""
    assert sum(chunks) == len(tokens)
    out, pos = [], 0
    for n in chunks:
        batch = ForwardBatch([SeqSlice(tokens[pos : pos + n], pos, page_table)])
        out.append(model.forward_all_logits(batch, pools))
        pos += n
    return torch.cat(out)


def triton_kernels(name: str):
    """The Triton kernel module dsv4bench.engine.kernels.<name>, the test skipped where triton
    is not installed."""
    mod = pytest.importorskip(f"dsv4bench.engine.kernels.{name}")
    if not mod.AVAILABLE:
        pytest.skip("triton not installed")
    return mod


def run_in_tritons_interpreter(test_file: str) -> None:
    """Run `test_file` as a script under TRITON_INTERPRET=1 (in a subprocess: the interpreter is
    chosen when a kernel is defined) and check that it printed "all cases agree"."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, test_file], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "all cases agree" in run.stdout
