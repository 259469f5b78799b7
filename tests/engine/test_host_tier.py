"""HostTier with the real model at a tiny config, real pools and the real loader thread: a prefix
evicted to host and loaded back while the model runs gives exactly the logits of a prefix never
evicted (fp8 and bf16 index keys); readers wait for their layer and no longer; the planted fault
lets the indexer score index keys that have not landed; a scheduler on HiCache with a real model
runner computes what a plain prefix cache computes and leaks nothing when a request is aborted
or the cache flushed while its load is in flight."""

from __future__ import annotations

import random
import time

import pytest
import torch

from dsv4bench.engine.config import EngineConfig
from dsv4bench.engine.hiradix_cache import HiRadixCache
from dsv4bench.engine.host_tier import HostTier
from dsv4bench.engine.memory import PageAllocator
from dsv4bench.engine.model import DSV4Mini, ForwardBatch, KVPools, SeqSlice
from dsv4bench.engine.model_runner import ModelRunner
from dsv4bench.engine.radix_cache import RadixCache
from dsv4bench.engine.request import Request, RequestState, SamplingParams
from dsv4bench.engine.scheduler import Scheduler

from .model.conftest import SMALL, random_tokens, run_chunks

P = 16
PREFIX, NEW = 160, 40  # 10 cached pages, then a 40-token chunk that reads them
SLOW = 0.0004  # GB/s: the 10-page load takes ~0.3 s, far longer than the forward
RACE = "hicache-index-race"


def cfg_for(mode: str = "fp8", gbps: float = SLOW, fault: bool = False, num_pages: int = 64) -> EngineConfig:
    return EngineConfig(
        model=SMALL,
        page_size=P,
        num_pages=num_pages,
        index_k_dtype=mode,
        hicache=True,
        hicache_load_gbps=gbps,
        faults=frozenset({RACE} if fault else ()),
    )


@pytest.fixture(scope="module")
def model() -> DSV4Mini:
    torch.manual_seed(0)
    return DSV4Mini(SMALL).eval()


def never_evicted(model: DSV4Mini, cfg: EngineConfig, prefix: list[int], new: list[int]) -> torch.Tensor:
    pools = KVPools(cfg)
    run_chunks(model, pools, prefix, [len(prefix)], list(range(10)))
    return model.forward_all_logits(ForwardBatch([SeqSlice(new, len(prefix), list(range(13)))]), pools)


def loaded_back(
    model: DSV4Mini, cfg: EngineConfig, prefix: list[int], new: list[int], wait: bool = False
) -> tuple[torch.Tensor, HostTier]:
    """The prefix computed in pages 0-9, backed up to host slots 0-9, pages 20-29 holding another
    sequence (what reused pages hold), then loaded into 20-29 while the new chunk runs."""
    pools = KVPools(cfg)
    tier = HostTier(pools, cfg)
    run_chunks(model, pools, prefix, [len(prefix)], list(range(10)))
    tier.backup(list(range(10)), list(range(10)))
    run_chunks(model, pools, random_tokens(len(prefix), seed=99), [len(prefix)], list(range(20, 30)))
    load = tier.load(list(range(10)), list(range(20, 30)))
    if wait:
        tier.wait_all()
    else:
        assert not load.landed(0), "the forward must overlap the load"
    batch = ForwardBatch([SeqSlice(new, len(prefix), list(range(20, 33)))])
    logits = model.forward_all_logits(batch, pools)
    tier.close()
    return logits, tier


@pytest.mark.parametrize("mode", ["fp8", "bf16"])
def test_prefix_loaded_back_layer_by_layer_gives_the_logits_of_one_never_evicted(model, mode):
    prefix, new = random_tokens(PREFIX, seed=1), random_tokens(NEW, seed=2)
    cfg = cfg_for(mode)
    got, tier = loaded_back(model, cfg, prefix, new)
    assert torch.equal(got, never_evicted(model, cfg, prefix, new))
    assert tier.bytes_loaded == 10 * tier.pools.bytes_per_page() and tier.unguarded_reads == 0


@pytest.mark.parametrize("mode", ["fp8", "bf16"])
def test_the_fault_lets_the_indexer_score_index_keys_that_have_not_landed(model, mode):
    prefix, new = random_tokens(PREFIX, seed=1), random_tokens(NEW, seed=2)
    ref = never_evicted(model, cfg_for(mode), prefix, new)
    picks: list[torch.Tensor] = []
    attn0 = model.blocks[0].attn
    select = attn0._select

    def recording(*args, **kwargs):
        out = select(*args, **kwargs)
        picks.append(out)
        return out

    attn0._select = recording
    chunk_picks = []  # layer 0's selection for the new chunk: the last call of each run
    try:
        raced, tier = loaded_back(model, cfg_for(mode, fault=True), prefix, new)
        chunk_picks.append(picks[-1])
        landed, _ = loaded_back(model, cfg_for(mode, fault=True), prefix, new, wait=True)
        chunk_picks.append(picks[-1])
        clean, _ = loaded_back(model, cfg_for(mode), prefix, new)
        chunk_picks.append(picks[-1])
    finally:
        del attn0._select
    assert tier.unguarded_reads > 0
    assert (raced - ref).abs().max() > 1e-2, "stale index keys changed nothing"
    assert not torch.equal(chunk_picks[0], chunk_picks[2]), "layer 0 picked the same blocks from stale keys"
    # Not garbage from the fault itself: once the load has landed, the same code is exact.
    assert torch.equal(landed, ref) and torch.equal(clean, ref)
    assert torch.equal(chunk_picks[1], chunk_picks[2])


def test_a_reader_waits_for_its_layer_and_no_longer():
    cfg = cfg_for(gbps=0.0002)
    pools = KVPools(cfg)
    tier = HostTier(pools, cfg)
    n = 4
    load = tier.load(list(range(n)), list(range(n)))
    t0 = time.monotonic()
    waited = []
    for layer in range(SMALL.n_layers):
        assert not load.landed(layer)
        tier.gate(layer, "kv")
        assert load.landed(layer)
        waited.append(time.monotonic() - t0)
        if layer == 0:
            assert not load.done(), "layer 0 must open before the whole load has landed"
    link = [sum(tier.layer_bytes_per_page[: l + 1]) * n / (cfg.hicache_load_gbps * 1e9) for l in range(SMALL.n_layers)]
    for got, want in zip(waited, link):
        assert want * 0.9 <= got <= want + 0.15, (waited, link)
    tier.close()


def test_the_fault_skips_only_the_index_k_wait():
    cfg = cfg_for(gbps=0.0002, fault=True)
    pools = KVPools(cfg)
    tier = HostTier(pools, cfg)
    load = tier.load([0, 1, 2, 3], [0, 1, 2, 3])
    tier.gate(0, "index_k")
    assert not load.landed(0) and tier.unguarded_reads == 1
    tier.gate(0, "kv")
    assert load.landed(0)
    tier.wait_all()
    tier.gate(1, "index_k")  # nothing in flight: nothing skipped
    assert tier.unguarded_reads == 1
    tier.close()


def test_bf16_index_keys_make_a_page_and_its_load_longer():
    sizes = {mode: HostTier(KVPools(cfg_for(mode)), cfg_for(mode)) for mode in ("fp8", "bf16")}
    for tier in sizes.values():
        tier.close()
    fp8, bf16 = sizes["fp8"].layer_bytes_per_page, sizes["bf16"].layer_bytes_per_page
    entries = P // SMALL.csa_rate
    for layer in range(SMALL.n_layers):
        extra = entries * SMALL.index_dim if SMALL.is_csa(layer) else 0  # one more byte per value
        assert bf16[layer] - fp8[layer] == extra


# ---- a scheduler on HiCache with the real model runner --------------------------------------


def serve_sessions(model: DSV4Mini, cfg: EngineConfig, turns: list[list[int]]) -> tuple[list[list[int]], Scheduler]:
    """Run each turn's prompt to completion, one after another (so batches match across setups)."""
    runner = ModelRunner(cfg, model)
    alloc = PageAllocator(cfg.num_pages)
    cache = HiRadixCache(P, alloc, HostTier(runner.pools, cfg)) if cfg.hicache else RadixCache(P, alloc)
    s = Scheduler(cfg, alloc, cache, eos_token_id=-1)
    outs = []
    for i, prompt in enumerate(turns):
        r = Request(f"t{i}", prompt, SamplingParams(max_tokens=4))
        s.add(r)
        while s.has_work:
            batch = s.schedule()
            assert batch is not None
            s.postprocess(batch, runner(batch))
            s.check_integrity()
        outs.append(r.output_ids)
    return outs, s


def agent_turns(n_sessions: int, n_turns: int, seed: int) -> list[list[int]]:
    """Sessions whose prompts grow turn by turn, interleaved, so each session's prefix is
    evicted by the others before it comes back."""
    rng = random.Random(seed)
    sessions = [random_tokens(rng.randint(40, 90), seed=seed * 100 + k) for k in range(n_sessions)]
    turns = []
    for _ in range(n_turns):
        for k in range(n_sessions):
            sessions[k] = sessions[k] + random_tokens(rng.randint(10, 30), seed=rng.randrange(10**6))
            turns.append(list(sessions[k]))
    return turns


def test_scheduler_on_hicache_computes_what_a_plain_cache_computes(model):
    turns = agent_turns(n_sessions=4, n_turns=3, seed=5)
    plain, _ = serve_sessions(model, EngineConfig(model=SMALL, page_size=P, num_pages=256), turns)
    got, s = serve_sessions(model, cfg_for(gbps=0.01, num_pages=24), turns)
    assert got == plain
    assert isinstance(s.cache, HiRadixCache)
    st = s.cache.stats()
    assert st.loads_total > 0 and st.pages_loaded_total > 0 and st.pages_backed_up_total > 0
    assert st.load_bytes_total == st.pages_loaded_total * KVPools(cfg_for()).bytes_per_page()


@pytest.mark.parametrize("then", ["abort", "flush"])
def test_abort_and_flush_during_a_load_leave_nothing_behind(model, then):
    cfg = cfg_for(gbps=0.001, num_pages=16)
    runner = ModelRunner(cfg, model)
    alloc = PageAllocator(cfg.num_pages)
    tier = HostTier(runner.pools, cfg)
    cache = HiRadixCache(P, alloc, tier)
    s = Scheduler(cfg, alloc, cache, eos_token_id=-1)
    a, b = random_tokens(150, seed=7), random_tokens(150, seed=8)
    for rid, prompt in (("a", a), ("b", b)):  # b evicts a's pages to the host
        s.add(Request(rid, prompt, SamplingParams(max_tokens=2)))
        while s.has_work:
            batch = s.schedule()
            assert batch is not None
            s.postprocess(batch, runner(batch))
    assert cache.num_host_pages > 0
    again = Request("a2", a + [1, 2, 3], SamplingParams(max_tokens=2))
    s.add(again)
    batch = s.schedule()  # matches a's host-resident prefix and starts loading it
    assert batch is not None and again.num_cached > 0 and tier.loads_in_flight() == 1
    if then == "abort":
        assert s.abort("a2")
        assert tier.loads_in_flight() == 1  # the cache now holds the pages being filled
        s.check_integrity()
    else:
        cache.reset()  # waits for the load, drops what a2 does not hold
        s.check_integrity()
        s.postprocess(batch, runner(batch))
        while s.has_work:
            batch = s.schedule()
            assert batch is not None
            s.postprocess(batch, runner(batch))
    s.check_integrity()
    cache.reset()
    assert tier.loads_in_flight() == 0 and alloc.num_free == cfg.num_pages and cache.num_host_pages == 0
    s.check_integrity()
    assert again.state is (RequestState.ABORTED if then == "abort" else RequestState.FINISHED)
    tier.close()
