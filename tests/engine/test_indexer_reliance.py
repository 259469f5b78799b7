"""The held-out reliance report on CPU at a tiny size: one JSON line per mode, number errors
with --tokenizer, and one-line errors for bad modes and bad tokenizer files."""

from __future__ import annotations

import json

import pytest

from dsv4bench.engine.training import indexer_reliance
from dsv4bench.engine.tokenizer import DEFAULT_PATH
from dsv4bench.engine.training.corpus import build_corpus

from .test_train import TINY


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    import torch

    from dsv4bench.engine.model import DSV4Mini
    from dsv4bench.engine.weights import save_weights

    d = tmp_path_factory.mktemp("reliance")
    build_corpus(["data"], [100_000], d / "h.npz", max_tokens=3000)
    torch.manual_seed(0)
    save_weights(DSV4Mini(TINY), d / "w.safetensors", dtype=torch.float32)
    return d


def test_one_line_per_mode_with_number_errors(files, capsys):
    indexer_reliance.main(
        [
            "--weights",
            str(files / "w.safetensors"),
            "--heldout",
            str(files / "h.npz"),
            "--device",
            "cpu",
            "--modes",
            "indexer,no-hca",
            "--tokenizer",
            str(DEFAULT_PATH),
        ]
    )
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["csa_pick"] for x in lines] == ["indexer", "no-hca"]
    assert all(x["numbers"] > 0 and 0.0 <= x["number_error"] <= 1.0 for x in lines)


@pytest.mark.parametrize(
    "args,message",
    [
        (["--modes", "bogus"], "unknown mode"),
        (["--tokenizer", "README.md"], "not a BPE tokenizer.json"),
        (["--tokenizer", "missing.json"], "not a BPE tokenizer.json"),
        (["--weights", "README.md"], "cannot read README.md as safetensors"),
    ],
)
def test_bad_arguments_get_one_line(files, capsys, args, message):
    with pytest.raises(SystemExit):
        indexer_reliance.main(
            ["--weights", str(files / "w.safetensors"), "--heldout", str(files / "h.npz"), "--device", "cpu", *args]
        )
    assert message in capsys.readouterr().err
