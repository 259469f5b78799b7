"""bench_decode's flags: each bad value is one line before anything is built, and on a machine
without CUDA it says so instead of failing deep in torch."""

from __future__ import annotations

import sys

import pytest
import torch

from tests.scripts.script_loader import load_script

bench_decode = load_script("bench_decode")


@pytest.mark.parametrize(
    "text, message",
    [
        ("5", "--ctx takes two whole numbers"),
        ("a,b", "--ctx takes two whole numbers"),
        ("1,2,3", "--ctx takes two whole numbers"),
        ("0,10", "--ctx needs 1 <= LO <= HI < 16384"),
        ("9,3", "--ctx needs 1 <= LO <= HI < 16384"),
        ("10,16384", "--ctx needs 1 <= LO <= HI < 16384"),
    ],
)
def test_bad_contexts_are_one_line(text, message):
    with pytest.raises(SystemExit, match=message):
        bench_decode.parse_contexts(text, 16384)


def test_good_contexts():
    assert bench_decode.parse_contexts("2048,4096", 16384) == (2048, 4096)
    assert bench_decode.parse_contexts("1,16383", 16384) == (1, 16383)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--batches", "0"], "--batches takes batch sizes of at least 1"),
        (["--batches", "80", "--profile", "256"], r"--profile names batches that --batches does not run: \[256\]"),
        (["--replays", "0"], "--replays takes at least 1"),
        (["--ctx", "4096,2048"], "--ctx needs"),
    ],
)
def test_bad_flags_stop_before_anything_is_built(monkeypatch, argv, message):
    monkeypatch.setattr(sys, "argv", ["bench_decode", *argv])
    monkeypatch.setattr(bench_decode, "DSV4Mini", None)  # building a model would be a bug here
    with pytest.raises(SystemExit, match=message):
        bench_decode.main()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_no_cuda_is_one_line(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["bench_decode", "--batches", "1"])
    with pytest.raises(SystemExit, match="times CUDA graphs; torch .* sees no CUDA device here"):
        bench_decode.main()
