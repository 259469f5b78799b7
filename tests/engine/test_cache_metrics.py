"""KV-cache pressure as the engine reports it, under SGLang's names: tokens evicted from the
device pool, loaded back from the host tier, the host tier's fill, the pool's split, cached
prompt tokens; per request, the cached tokens split by tier (`cached_tokens_details`) in
/generate's meta_info and in the OpenAI answers' `sglext`; `max_total_num_tokens` on
/get_server_info.

The engine is the real loop, scheduler and caches with a scripted runner in place of the model
and a host tier without a data plane (no reader of the pools here), on a pool of a few pages so
that a handful of prompts forces evictions. The counts of the loop-driven tests are traced by
hand: page size 4, prompts of two pages, one output token each, least recently used first.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dsv4bench.engine import server_facts
from dsv4bench.engine.config import EngineConfig, ModelConfig
from dsv4bench.engine.frontend import Frontend
from dsv4bench.engine.hiradix_cache import HiRadixCache
from dsv4bench.engine.memory import PageAllocator
from dsv4bench.engine.metrics import METRIC_NAMES, ServerMetrics
from dsv4bench.engine.radix_cache import RadixCache
from dsv4bench.engine.request import Request, SamplingParams
from dsv4bench.engine.scheduler import ScheduledBatch, Scheduler
from dsv4bench.engine.server import ServerConfig, build_app
from dsv4bench.engine.server_loop import TokenEvent
from dsv4bench.engine.tokenizer import load_tokenizer
from dsv4bench.engine.unified_engine import AsyncEngine, UnifiedEngine

from .pd.helpers import ServerThread

P = 4
MODEL = "dsv4-mini"
SMALL = ModelConfig(csa_rate=2, hca_rate=4, window=8, max_context=4096)
TOK = load_tokenizer()
TEXT_ID = TOK.encode("ok")[0]
HOST_SERIES = ("sglang:hicache_", "sglang:load_back_tokens", "dsv4mini:hicache_")


class Landed:
    def done(self) -> bool:
        return True


class InstantMover:
    """A host tier whose copies are bookkeeping only: every load has landed when it returns."""

    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self.bytes_loaded = 0
        self.unguarded_reads = 0

    def backup(self, device_pages: list[int], host_slots: list[int]) -> None:
        pass

    def load(self, host_slots: list[int], device_pages: list[int]) -> Landed:
        return Landed()

    def wait_all(self) -> None:
        pass


def runner(batch: ScheduledBatch) -> dict[str, int]:
    return {e.req.rid: TEXT_ID for e in batch.entries if e.sample}


def build(num_pages: int, hicache: bool, host_pages: int = 16) -> UnifiedEngine:
    cfg = EngineConfig(model=SMALL, page_size=P, num_pages=num_pages, hicache=hicache, hicache_host_pages=host_pages)
    alloc = PageAllocator(num_pages)
    cache = HiRadixCache(P, alloc, InstantMover(host_pages)) if hicache else RadixCache(P, alloc)
    return UnifiedEngine(cfg, Scheduler(cfg, alloc, cache, TOK.eos_token_id), runner)


class Events:
    def __init__(self) -> None:
        self.events: list[TokenEvent] = []

    def push(self, event: TokenEvent) -> None:
        self.events.append(event)


def serve(engine: UnifiedEngine, prompt: list[int]) -> TokenEvent:
    """Serve one request to its end, driving the loop by hand; its last event."""
    sink = Events()
    engine.submit(Request(f"r{engine.counts['requests']}", prompt, SamplingParams(max_tokens=1)), sink)
    for _ in range(100):
        engine.run_once(block=False)
        if sink.events and sink.events[-1].finish_reason is not None:
            return sink.events[-1]
    raise AssertionError("the request did not finish")


def prompt(k: int) -> list[int]:
    """The k-th of distinct two-page prompts."""
    return [100 + 2 * P * k + i for i in range(2 * P)]


def scrape(engine: UnifiedEngine) -> tuple[set[str], dict[str, float]]:
    """The /metrics text of `engine`, through prometheus_client's own parser: family names and
    sample values."""
    text = ServerMetrics(lambda: engine.stats, MODEL, "unified", P).render().decode()
    families = list(text_string_to_metric_families(text))
    return {f.name for f in families}, {s.name: s.value for f in families for s in f.samples}


@pytest.mark.parametrize("hicache", [False, True])
def test_evictions_are_counted_in_whole_pages_with_or_without_hicache(hicache):
    engine = build(num_pages=6, hicache=hicache)
    for k in range(3):  # three prompts fill the pool's six pages with cached prefixes
        serve(engine, prompt(k))
    assert engine.stats.kv.evicted_tokens_total == 0
    assert engine.stats.kv == (6 * P, 0, 6 * P, 0, 0)  # the pool, used, evictable, available, evicted
    serve(engine, prompt(3))  # its two pages push out the least recently used prompt, 0
    assert engine.stats.kv.evicted_tokens_total == 2 * P
    again = serve(engine, prompt(3))  # warm: its first page cached; its second page evicts prompt 1
    assert (again.cached_tokens, again.cached_tokens_host) == (P, 0)
    assert engine.stats.kv.evicted_tokens_total == 4 * P
    names, samples = scrape(engine)
    assert samples["sglang:evicted_tokens_total"] == 4 * P
    assert samples["sglang:max_total_num_tokens"] == 6 * P
    used, evictable, available = (samples[f"sglang:kv_{k}_tokens"] for k in ("used", "evictable", "available"))
    assert used == 0 and used + evictable + available == 6 * P
    assert samples["sglang:cached_tokens_total"] == P
    # A flush drops the cache but evicts nothing: the counter stays where it was.
    engine.scheduler.cache.reset()
    engine.run_once(block=False)
    assert engine.stats.kv.evicted_tokens_total == 4 * P
    assert (engine.stats.kv.evictable_tokens, engine.stats.kv.available_tokens) == (0, 6 * P)
    host_series = {n for n in names if n.startswith(HOST_SERIES)}
    if hicache:
        assert {"sglang:hicache_host_used_tokens", "sglang:load_back_tokens"} <= host_series
    else:
        assert not host_series, "a server without HiCache exports no host tier"


def test_hicache_loads_back_an_evicted_prefix_and_reports_it_as_host_hits():
    engine = build(num_pages=6, hicache=True, host_pages=16)
    for k in range(4):  # the fourth pushes prompt 0 to the host tier
        serve(engine, prompt(k))
    hi = engine.stats.hicache
    assert hi is not None and (hi.host_used_tokens, hi.load_back_tokens_total) == (2 * P, 0)
    back = serve(engine, prompt(0))  # its first page comes back from the host; prompt 1 goes there
    assert (back.cached_tokens, back.cached_tokens_host) == (P, P)
    hi = engine.stats.hicache
    assert hi is not None and hi.load_back_tokens_total == P and hi.host_used_tokens == 4 * P
    assert engine.stats.kv.evicted_tokens_total == 4 * P
    warm = serve(engine, prompt(0))  # the same prefix, now on the device
    assert (warm.cached_tokens, warm.cached_tokens_host) == (P, 0)
    hi = engine.stats.hicache
    names, samples = scrape(engine)
    assert samples["sglang:load_back_tokens_total"] == P
    assert hi is not None and samples["sglang:hicache_host_used_tokens"] == hi.host_used_tokens == 6 * P
    assert samples["sglang:hicache_host_total_tokens"] == 16 * P
    assert samples["sglang:evicted_tokens_total"] == 6 * P  # prompt 2 made room for the warm one's page
    assert samples["sglang:cached_tokens_total"] == 2 * P
    assert samples["dsv4mini:hicache_pages_loaded_total"] == 1  # our own series stay beside SGLang's
    assert set(METRIC_NAMES) <= names


def test_server_info_states_the_device_pool_where_sglang_does():
    cfg = EngineConfig(model=SMALL, page_size=P, num_pages=6, hicache=True, hicache_host_pages=12)
    info = server_facts.server_info(cfg, "unified", MODEL, TOK, 4096)
    assert info["max_total_num_tokens"] == 6 * P  # top level, as SGLang spreads its scheduler info there
    assert (info["page_size"], info["context_length"], info["enable_hierarchical_cache"]) == (P, 4096, True)
    assert info["hicache_ratio"] == 2.0
    assert "max_total_num_tokens" not in server_facts.server_info(cfg, "router", MODEL, TOK, 4096)


# ---- the split over HTTP ----------------------------------------------------------------------

CHAT = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Say ok. " * 6}],
    "max_tokens": 2,
    "return_cached_tokens_details": True,
}


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    loop = build(num_pages=16, hicache=True, host_pages=64)
    loop.start()
    srv = ServerThread(
        build_app(AsyncEngine(loop.cfg, loop, TOK.eos_token_id), Frontend(TOK, MODEL, 4096), ServerConfig())
    )
    yield srv.url
    srv.stop()
    loop.stop()


def post(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(f"{url}{path}", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def filler(k: int) -> dict[str, Any]:
    return {"input_ids": [2000 + 3 * P * k + i for i in range(3 * P)], "sampling_params": {"max_new_tokens": 1}}


def test_a_prefix_pushed_to_the_host_and_back_is_split_by_tier_in_every_answer(url):
    first = post(url, "/v1/chat/completions", CHAT)
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0 and "sglext" not in first
    metas = [post(url, "/generate", filler(k))["meta_info"] for k in range(6)]  # 18 pages through a 16-page pool
    assert metas[0]["cached_tokens_details"] is None  # nothing cached: SGLang gives None
    back = post(url, "/v1/chat/completions", CHAT)
    cached = back["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0 and back["sglext"] == {"cached_tokens_details": {"device": 0, "host": cached}}
    warm = post(url, "/v1/chat/completions", CHAT)
    assert warm["sglext"] == {"cached_tokens_details": {"device": cached, "host": 0}}
    plain = post(url, "/v1/chat/completions", {**CHAT, "return_cached_tokens_details": False})
    assert "sglext" not in plain and plain["usage"]["prompt_tokens_details"]["cached_tokens"] == cached
    again = post(url, "/generate", filler(5))["meta_info"]  # the last filler is still on the device
    assert (
        again["cached_tokens_details"] == {"device": again["cached_tokens"], "host": 0} and again["cached_tokens"] > 0
    )
    oldest = post(url, "/generate", filler(0))["meta_info"]  # pushed out to the host by the later ones
    assert oldest["cached_tokens_details"] == {"device": 0, "host": oldest["cached_tokens"]}
    completion = post(
        url,
        "/v1/completions",
        {"model": MODEL, "prompt": filler(0)["input_ids"], "max_tokens": 1, "return_cached_tokens_details": True},
    )
    details = completion["sglext"]["cached_tokens_details"]
    assert details["device"] + details["host"] == completion["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_a_streamed_answer_sends_the_split_after_the_finish_and_before_the_usage(url):
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    post(url, "/v1/chat/completions", CHAT)  # warm
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=30) as r:
        payloads = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert payloads[-1] == "[DONE]"
    *_, finish, ext, usage = [json.loads(p) for p in payloads[:-1]]
    assert finish["choices"][0]["finish_reason"] == "length"
    cached = usage["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert ext["choices"] == [] and ext["usage"] is None and ext["object"] == "chat.completion.chunk"
    assert ext["sglext"] == {"cached_tokens_details": {"device": cached, "host": 0}} and cached > 0
    assert not any("sglext" in json.loads(p) for p in payloads[:-4])
