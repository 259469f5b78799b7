"""Scheduler driven by a fake model: lifecycle, chunked prefill, prefix sharing, abort in every
state, preemption, stop conditions, and integrity after every step of random workloads."""

from __future__ import annotations

import random

import pytest

from dsv4bench.engine.config import EngineConfig, ModelConfig
from dsv4bench.engine.memory import PageAllocator
from dsv4bench.engine.radix_cache import RadixCache
from dsv4bench.engine.request import FinishReason, Request, RequestState, SamplingParams
from dsv4bench.engine.scheduler import OutputEvent, ScheduledBatch, Scheduler

P = 4
VOCAB = 1000
EOS = VOCAB - 1
W, PF, RN, FI, AB = (
    RequestState.WAITING,
    RequestState.PREFILL,
    RequestState.RUNNING,
    RequestState.FINISHED,
    RequestState.ABORTED,
)


def make(
    num_pages: int = 256, chunk: int = 64, max_running: int = 128, max_context: int = 4096, prefix_cache: bool = True
) -> Scheduler:
    model = ModelConfig(csa_rate=2, hca_rate=4, window=8, max_context=max_context)
    cfg = EngineConfig(
        model=model,
        page_size=P,
        num_pages=num_pages,
        max_running_requests=max_running,
        chunked_prefill_tokens=chunk,
        enable_prefix_cache=prefix_cache,
    )
    alloc = PageAllocator(num_pages)
    return Scheduler(cfg, alloc, RadixCache(P, alloc), eos_token_id=EOS)


def req(rid: str, prompt: list[int], max_tokens: int = 8, stop: tuple[int, ...] = ()) -> Request:
    return Request(rid, prompt, SamplingParams(max_tokens=max_tokens, stop_token_ids=stop))


class FakeModel:
    """Writes each scheduled token into its page slot and checks that every earlier position
    of the request reads back the right token (shared and cached pages included). Next token
    = (last token + 1) % VOCAB."""

    def __init__(self) -> None:
        self.kv: dict[int, dict[int, int]] = {}

    def run(self, batch: ScheduledBatch) -> dict[str, int]:
        out: dict[str, int] = {}
        for e in batch.entries:
            r = e.req
            toks = r.tokens
            for pos in range(e.start_pos):
                assert self.kv[r.pages[pos // P]][pos % P] == toks[pos], (r.rid, pos)
            for i, t in enumerate(e.token_ids):
                pos = e.start_pos + i
                assert toks[pos] == t
                self.kv.setdefault(r.pages[pos // P], {})[pos % P] = t
            if e.sample:
                out[r.rid] = (e.token_ids[-1] + 1) % VOCAB
        return out


def step(s: Scheduler, model: FakeModel) -> tuple[ScheduledBatch | None, list[OutputEvent]]:
    batch = s.schedule()
    s.check_integrity()
    if batch is None:
        return None, []
    assert batch.num_prefill_tokens <= s.cfg.chunked_prefill_tokens
    events = s.postprocess(batch, model.run(batch))
    s.check_integrity()
    return batch, events


def drain(s: Scheduler, model: FakeModel, max_steps: int = 5000) -> int:
    for n in range(max_steps):
        if not s.has_work:
            return n
        batch, _ = step(s, model)
        assert batch is not None, "work left but nothing scheduled: deadlock"
    raise AssertionError("did not finish")


def expected_output(prompt: list[int], n: int) -> list[int]:
    return [(prompt[-1] + k) % VOCAB for k in range(1, n + 1)]


def test_single_request_lifecycle_with_chunked_prefill() -> None:
    s, m = make(chunk=16), FakeModel()
    r = req("a", list(range(50)), max_tokens=5)
    s.add(r)
    assert r.state is W
    chunks = []
    while r.state is not RN:
        batch, events = step(s, m)
        assert batch is not None and len(batch.entries) == 1
        (e,) = batch.entries
        chunks.append((e.start_pos, len(e.token_ids), e.sample))
        if r.state is PF:
            assert events == [] and s.stats().num_prefill == 1
    assert chunks == [(0, 16, False), (16, 16, False), (32, 16, False), (48, 2, True)]
    assert r.output_ids == [50] and r.first_token_at is not None
    assert s.stats().num_running == 1
    evs = []
    while r.state is RN:
        batch, events = step(s, m)
        assert batch is not None and batch.num_decode == 1 and batch.entries[0].token_ids == [r.output_ids[-2]]
        evs += events
    assert r.state is FI and r.finish_reason is FinishReason.LENGTH
    assert r.output_ids == [50, 51, 52, 53, 54]
    assert evs[-1] == OutputEvent("a", 54, FinishReason.LENGTH)
    assert [e.finish_reason for e in evs[:-1]] == [None] * 3
    # 54 computed tokens -> 13 full pages stay cached, everything else is free
    st = s.stats()
    assert st.num_cached_pages == 13 and st.pages_free == 256 - 13 and st.token_usage == 0.0
    assert s.schedule() is None


def test_eighty_concurrent_requests_all_finish() -> None:
    rng = random.Random(0)
    s, m = make(num_pages=400, chunk=128, max_running=48), FakeModel()
    reqs = [
        req(f"r{i}", [rng.randrange(800) for _ in range(rng.randint(1, 120))], rng.randint(1, 30)) for i in range(80)
    ]
    for r in reqs:
        s.add(r)
    steps = drain(s, m)
    assert steps < 1000
    for r in reqs:
        assert r.state is FI and r.finish_reason is FinishReason.LENGTH
        assert r.output_ids == expected_output(r.prompt_ids, r.params.max_tokens)
    s.cache.reset()
    assert s.allocator.num_free == 400


def test_shared_prefix_is_served_from_cache() -> None:
    s, m = make(chunk=32), FakeModel()
    base = [7] * 30 + list(range(50))
    a = req("a", base, max_tokens=3)
    s.add(a)
    drain(s, m)
    assert a.num_cached == 0
    b = req("b", base[:70] + [900] * 10, max_tokens=3)
    s.add(b)
    batch, _ = step(s, m)
    assert b.num_cached == 68 and b.shared_pages == 17  # page-aligned prefix of the 70 shared
    assert batch is not None and [(e.start_pos, len(e.token_ids)) for e in batch.entries] == [(68, 12)]
    st = s.stats()  # a's 20 full pages are cached; b shares 17 of them and owns 3 more
    assert (st.num_cached_pages, st.pages_used, st.token_usage) == (20, 23, 20 / 256)
    drain(s, m)
    assert b.output_ids == expected_output(b.prompt_ids, 3)
    c = req("c", list(base), max_tokens=2)  # identical prompt: at least one token computed
    s.add(c)
    step(s, m)
    assert c.num_cached == 76
    assert 0 < s.stats().cache_hit_rate < 1


@pytest.mark.parametrize("where", ["waiting", "prefill", "running", "in_flight"])
def test_abort_in_each_state_frees_every_page(where: str) -> None:
    s, m = make(num_pages=64, chunk=8, max_running=1), FakeModel()
    first = req("first", list(range(30)), max_tokens=50)
    second = req("second", list(range(100, 120)), max_tokens=50)
    s.add(first)
    s.add(second)
    target = {"waiting": second}.get(where, first)
    if where in ("prefill", "running"):
        while first.state is not (PF if where == "prefill" else RN) or first.num_computed < 9:
            step(s, m)
        assert first.state is (PF if where == "prefill" else RN)
    batch = s.schedule()
    sampled = m.run(batch) if batch is not None else {}
    if where != "in_flight":
        assert batch is not None
        s.postprocess(batch, sampled)
        batch = None
    assert target.state is ({"waiting": W, "prefill": PF}.get(where, PF if where == "in_flight" else RN))
    assert s.abort(target.rid)
    assert target.state is AB and target.finish_reason is FinishReason.ABORT and target.pages == []
    assert not s.abort(target.rid) and not s.abort("nope")
    if batch is not None:  # the model was running when the client went away
        events = s.postprocess(batch, sampled)
        assert all(e.rid != target.rid for e in events)
    s.check_integrity()
    drain(s, m)
    st = s.stats()
    assert st.pages_free == 64 - st.num_cached_pages
    s.cache.reset()
    assert s.allocator.num_free == 64
    s.check_integrity()


def test_preemption_when_pages_run_out_and_everything_finishes() -> None:
    s, m = make(num_pages=12, chunk=64), FakeModel()
    reqs = [req(f"r{i}", [i * 50 + k for k in range(10)], max_tokens=30) for i in range(4)]
    for r in reqs:
        s.add(r)
    saw_waiting_with_output = False
    for _ in range(2000):
        if not s.has_work:
            break
        batch, _ = step(s, m)
        assert batch is not None
        saw_waiting_with_output |= any(r.state is W and r.output_ids for r in reqs)
        assert reqs[0].state is not W  # the oldest request is never the victim
    assert not s.has_work
    assert s.stats().num_preemptions > 0 and saw_waiting_with_output
    for r in reqs:
        assert r.state is FI and r.output_ids == expected_output(r.prompt_ids, 30)


def test_decode_preempts_the_newest_running_request() -> None:
    s, m = make(num_pages=5, chunk=64), FakeModel()
    old, new = req("old", list(range(7)), max_tokens=10), req("new", list(range(100, 107)), max_tokens=10)
    s.add(old)
    s.add(new)
    step(s, m)  # both admitted: 2 pages each, 8 positions, 7 computed + 1 sampled
    assert old.state is RN and new.state is RN and s.allocator.num_free == 1
    step(s, m)  # position 7 still fits in the second page
    step(s, m)  # position 8: old takes the last page; new has none left -> preempted
    assert old.state is RN and new.state is W and new.pages == [] and new.output_ids == [107, 108]
    assert s.stats().num_preemptions == 1 and s.stats().num_waiting == 1
    drain(s, m)
    assert old.output_ids == expected_output(old.prompt_ids, 10)
    assert new.output_ids == expected_output(new.prompt_ids, 10)


def test_context_longer_than_the_pool_finishes_instead_of_thrashing() -> None:
    s, m = make(num_pages=6, max_context=4096), FakeModel()
    assert s.max_seq_len == 24
    with pytest.raises(ValueError):
        s.add(req("big", list(range(24))))
    r = req("a", list(range(10)), max_tokens=100)
    s.add(r)
    drain(s, m)
    assert r.finish_reason is FinishReason.LENGTH and r.num_tokens == 24


@pytest.mark.parametrize("seed", range(12))
def test_random_workload_with_aborts_keeps_integrity(seed: int) -> None:
    rng = random.Random(seed)
    pages = rng.choice([24, 40, 96])
    s = make(num_pages=pages, chunk=rng.choice([4, 16, 64]), max_running=rng.choice([2, 8, 32]))
    m = FakeModel()
    prefixes = [[rng.randrange(800) for _ in range(rng.randint(0, 24))] for _ in range(3)]
    live: list[Request] = []
    done: list[Request] = []
    for i in range(60):
        if rng.random() < 0.7:
            prompt = rng.choice(prefixes) + [rng.randrange(800) for _ in range(rng.randint(1, 40))]
            r = req(f"r{i}", prompt, rng.randint(1, 20))
            s.add(r)
            live.append(r)
        if live and rng.random() < 0.15:
            r = rng.choice(live)
            assert s.abort(r.rid)
            s.check_integrity()
        step(s, m)
        done += [r for r in live if r.state.done]
        live = [r for r in live if not r.state.done]
    drain(s, m)
    for r in done + live:
        if r.state is FI:
            assert r.output_ids == expected_output(r.prompt_ids, r.params.max_tokens)
        else:
            assert r.state is AB
    s.cache.reset()
    assert s.allocator.num_free == pages


def test_stop_on_eos() -> None:
    s, m = make(), FakeModel()
    r = req("a", [1, 2, EOS - 1], max_tokens=10)
    s.add(r)
    _, events = step(s, m)
    assert events == [OutputEvent("a", EOS, FinishReason.STOP)]
    assert r.state is FI and r.output_ids == [EOS]  # the EOS id is delivered, then it ends


def test_stop_on_stop_token() -> None:
    s, m = make(), FakeModel()
    r = req("a", [5], max_tokens=10, stop=(8,))
    s.add(r)
    drain(s, m)
    assert r.output_ids == [6, 7, 8] and r.finish_reason is FinishReason.STOP


def test_stop_on_max_tokens_of_one() -> None:
    s, m = make(), FakeModel()
    r = req("a", [5, 6], max_tokens=1)
    s.add(r)
    _, events = step(s, m)
    assert events == [OutputEvent("a", 7, FinishReason.LENGTH)] and r.state is FI


def test_stop_on_context_limit() -> None:
    s, m = make(max_context=64), FakeModel()
    r = req("a", list(range(60)), max_tokens=100)
    s.add(r)
    drain(s, m)
    assert r.finish_reason is FinishReason.LENGTH and r.num_tokens == 64 and len(r.output_ids) == 4


def test_add_rejects_bad_requests() -> None:
    s = make(max_context=64)
    with pytest.raises(ValueError):
        s.add(req("a", []))
    with pytest.raises(ValueError):
        s.add(req("a", list(range(64))))
    s.add(req("a", [1]))
    with pytest.raises(ValueError):
        s.add(req("a", [2]))


def test_admission_respects_max_running_and_fcfs() -> None:
    s, m = make(max_running=2, chunk=1000), FakeModel()
    rs = [req(f"r{i}", [i] * 5, max_tokens=3) for i in range(4)]
    for r in rs:
        s.add(r)
    step(s, m)
    assert [r.state for r in rs] == [RN, RN, W, W]
    assert s.stats().num_waiting == 2
    drain(s, m)
    assert all(r.state is FI for r in rs)


def test_prefix_cache_disabled_caches_nothing() -> None:
    s, m = make(prefix_cache=False), FakeModel()
    for i in range(2):
        r = req(f"r{i}", list(range(40)), max_tokens=3)
        s.add(r)
        drain(s, m)
        assert r.num_cached == 0
    assert s.stats().num_cached_pages == 0 and s.allocator.num_free == 256


def test_illegal_transition_asserts() -> None:
    r = req("a", [1])
    with pytest.raises(AssertionError):
        r.transition(RN)
    r.transition(AB)
    with pytest.raises(AssertionError):
        r.transition(W)
