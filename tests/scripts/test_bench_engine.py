"""scripts/bench_engine.py forms every batch it accepts: its config holds the largest batch whole
(a running slot per request, every request's pages at once), and bad --batches are one line."""

from __future__ import annotations


import pytest

from tests.scripts.script_loader import load_script

bench = load_script("bench_engine")


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


@pytest.mark.parametrize("prompt, out", [(0, 32), (2048, 0), (-5, 32)])
def test_empty_prompts_or_outputs_are_one_line(prompt, out):
    cfg = bench.engine_config("cpu", [1], prompt, out)
    with pytest.raises(SystemExit, match="--prompt-tokens and --max-tokens take at least 1"):
        bench.check_sizes([1], prompt, out, cfg)


def test_a_batch_whose_requests_outgrow_the_context_is_refused_by_name():
    # With 2,048-token prompts and chunks, a request of batch b decodes through b prefill steps,
    # then b + 32 more: at 8,000 that is 16,032 output tokens, 18,080 with the prompt.
    cfg = bench.engine_config("cpu", [80, 8000], 2048, 32)
    with pytest.raises(
        SystemExit,
        match=r"batch 8000 cannot be formed: .* 16032 output tokens .*, 18080 in all, "
        r"over the model's context of 16384",
    ):
        bench.check_sizes([80, 8000], 2048, 32, cfg)


@pytest.mark.parametrize("batches", [[1, 8, 80], [256, 1024], [3000]])
def test_every_batch_it_accepts_fits_the_context_and_its_pages(batches):
    prompt, out = 2048, 32
    cfg = bench.engine_config("cpu", batches, prompt, out)
    bench.check_sizes(batches, prompt, out, cfg)  # accepted
    for b in batches:
        tokens = prompt + bench.output_tokens(b, prompt, out, cfg.chunked_prefill_tokens)
        assert tokens <= cfg.model.max_context
        assert b * -(-tokens // cfg.page_size) <= cfg.num_pages


def test_cuda_without_a_cuda_device_is_one_line():
    if bench.torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    with pytest.raises(SystemExit, match="--device cuda: torch .* sees no CUDA device here"):
        bench.check_device("cuda")
    bench.check_device("cpu")
