"""scripts/bench_engine.py forms every batch it accepts: its config holds the largest batch whole
(a running slot per request, every request's pages at once), and bad --batches are one line."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("bench_engine", Path(__file__).parents[2] / "scripts" / "bench_engine.py")
assert _spec and _spec.loader
bench = sys.modules["bench_engine"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


@pytest.mark.parametrize("batches", [[1, 8, 80], [1, 80, 256], [1024]])
def test_the_config_holds_the_largest_batch_whole(batches):
    prompt, out = 2048, 32
    cfg = bench.engine_config("cpu", batches, prompt, out)
    assert cfg.max_running_requests >= max(batches)
    for b in batches:
        tokens = prompt + bench.output_tokens(b, prompt, out, cfg.chunked_prefill_tokens)
        assert b * -(-tokens // cfg.page_size) <= cfg.num_pages


@pytest.mark.parametrize("text", ["", "0", "1,x", "8,-1"])
def test_bad_batches_are_one_line(text):
    with pytest.raises(SystemExit, match="--batches takes"):
        bench.parse_batches(text)
