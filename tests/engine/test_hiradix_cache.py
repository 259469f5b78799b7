"""HiRadixCache (torch-free): eviction to the host tier, load back on a match, host LRU, pinning
of loads in flight, revival on insert, reset, and integrity plus page contents under random
operations and under the scheduler with aborts and preemption."""

from __future__ import annotations

import random

import pytest

from dsv4bench.engine.config import EngineConfig, ModelConfig
from dsv4bench.engine.hiradix_cache import HiRadixCache
from dsv4bench.engine.memory import PageAllocator
from dsv4bench.engine.request import Request, RequestState, SamplingParams
from dsv4bench.engine.scheduler import ScheduledBatch, Scheduler

P = 4


class Handle:
    def __init__(self) -> None:
        self.landed = False

    def done(self) -> bool:
        return self.landed


class FakeMover:
    """Page contents as dicts {position in page: token}: `device[page]`, `host[slot]`. A load
    lands only when `land()` is called (the gate), so a cache that let a page being loaded be
    reused, or its host copy be overwritten, shows up as wrong contents or a failed assert."""

    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self.device: dict[int, dict[int, int]] = {}
        self.host: dict[int, dict[int, int]] = {}
        self.pending: list[tuple[list[int], list[int], Handle]] = []
        self.num_backups = 0
        self.bytes_loaded = 0
        self.unguarded_reads = 0

    def backup(self, device_pages: list[int], host_slots: list[int]) -> None:
        assert not {p for _, ps, _ in self.pending for p in ps} & set(device_pages), "backup of a loading page"
        assert not {s for ss, _, _ in self.pending for s in ss} & set(host_slots), "backup over a copy being read"
        for p, s in zip(device_pages, host_slots):
            self.host[s] = dict(self.device.get(p, {}))
        self.num_backups += len(device_pages)

    def load(self, host_slots: list[int], device_pages: list[int]) -> Handle:
        h = Handle()
        self.pending.append((list(host_slots), list(device_pages), h))
        return h

    def land(self, pages: set[int] | None = None) -> None:
        """Land the loads that write any of `pages` (all loads when None)."""
        keep = []
        for slots, ps, h in self.pending:
            if pages is None or set(ps) & pages:
                for s, p in zip(slots, ps):
                    self.device[p] = dict(self.host[s])
                self.bytes_loaded += len(ps)
                h.landed = True
            else:
                keep.append((slots, ps, h))
        self.pending = keep

    def wait_all(self) -> None:
        self.land()


def make(num_pages: int = 16, host_slots: int = 32) -> tuple[PageAllocator, FakeMover, HiRadixCache]:
    a, mv = PageAllocator(num_pages), FakeMover(host_slots)
    return a, mv, HiRadixCache(P, a, mv)


def compute(
    a: PageAllocator, mv: FakeMover, c: HiRadixCache, tokens: list[int], shared: list[int] | None = None
) -> list[int] | None:
    """A request that computed the full pages of `tokens` after the `shared` ones into fresh
    device pages (evicting if short); None when they do not fit."""
    pages = list(shared or [])
    need = len(tokens) // P - len(pages)
    if not a.can_alloc(need):
        c.evict(need - a.num_free)
    if not a.can_alloc(need):
        return None
    pages += a.alloc(need)
    for i in range(len(shared or []), len(pages)):
        mv.device[pages[i]] = {j: tokens[i * P + j] for j in range(P)}
    return pages


def assert_holds(mv: FakeMover, pages: list[int], tokens: list[int]) -> None:
    mv.land(set(pages))
    for i, p in enumerate(pages):
        assert mv.device[p] == {j: tokens[i * P + j] for j in range(P)}, f"page {i} (id {p})"


def put(a: PageAllocator, mv: FakeMover, c: HiRadixCache, tokens: list[int]) -> list[int]:
    pages = compute(a, mv, c, tokens)
    assert pages is not None
    c.insert(tokens, pages)
    return pages


def test_evicted_pages_go_to_host_and_load_back_into_new_pages() -> None:
    a, mv, c = make(num_pages=4)
    A = list(range(12))
    put(a, mv, c, A)
    assert c.evict(3) == 3
    assert (c.num_cached_pages, c.num_host_pages, a.num_free, mv.num_backups) == (0, 3, 4, 3)
    c.check_integrity()
    B = [100 + t for t in range(16)]
    put(a, mv, c, B)  # all 4 device pages: A's old page contents are overwritten
    m = c.match_prefix(A)  # B goes to the host to make room, A comes back
    assert m.num_tokens == 12 and (c.num_loads, c.num_pages_loaded) == (1, 3)
    assert (mv.num_backups, c.num_host_pages, c.num_cached_pages) == (7, 7, 3)
    assert c.match_prefix(B).num_tokens == 0  # 4 pages needed, 1 free, A pinned by its load
    c.check_integrity()
    assert_holds(mv, m.pages, A)
    c.check_integrity()


def test_host_copy_is_kept_so_a_second_eviction_copies_nothing() -> None:
    a, mv, c = make()
    A = list(range(8))
    put(a, mv, c, A)
    c.evict(2)
    m = c.match_prefix(A)
    mv.land()
    c.evict(2)
    assert mv.num_backups == 2 and c.num_host_pages == 2 and c.num_cached_pages == 0
    assert_holds(mv, c.match_prefix(A).pages, A)
    assert m.num_tokens == 8
    c.check_integrity()


def test_full_host_drops_least_recently_used_copies_and_their_nodes() -> None:
    a, mv, c = make(num_pages=8, host_slots=4)
    A, B, C = list(range(8)), list(range(100, 108)), list(range(200, 208))
    for toks in (A, B, C):
        put(a, mv, c, toks)
        c.evict(2)
        c.check_integrity()
    assert c.num_host_pages == 4
    assert c.match_prefix(A).num_tokens == 0  # oldest copy went, and its node with it
    assert_holds(mv, c.match_prefix(C).pages, C)
    assert_holds(mv, c.match_prefix(B).pages, B)
    c.check_integrity()


def test_a_load_in_flight_pins_its_pages_and_host_copy() -> None:
    a, mv, c = make(num_pages=4, host_slots=2)
    A = list(range(8))
    put(a, mv, c, A)
    c.evict(2)
    m = c.match_prefix(A)  # load started, not landed
    assert c.evict(4) == 0 and c.num_cached_pages == 2
    assert c._evict_host(2) == 0 and c.num_host_pages == 2
    c.check_integrity()
    mv.land()
    assert c.evict(4) == 2  # landed: evictable again (host copy reused, no backup)
    assert mv.num_backups == 2
    assert m.num_tokens == 8


def test_match_keeps_its_device_prefix_and_loads_what_fits() -> None:
    a, mv, c = make(num_pages=5, host_slots=16)
    Z = list(range(16))
    put(a, mv, c, Z)
    c.match_prefix(Z, 4)
    c.match_prefix(Z, 8)  # now three nodes: X (page 0), Y (page 1), W (pages 2-3)
    assert c.evict(3) == 3  # W, then Y (left without device children), go to the host
    assert c.num_cached_pages == 1 and c.num_host_pages == 3
    held = a.alloc(2)  # another request's pages: 2 device pages left free
    m = c.match_prefix(Z)  # X is the only device leaf, yet it must stay: it is the match
    assert m.num_tokens == 8, "X kept, Y loaded; W (2 pages) does not fit in what is left"
    assert_holds(mv, m.pages, Z)
    a.decref(held)
    c.check_integrity()


def test_insert_gives_a_host_only_node_the_callers_fresh_pages() -> None:
    a, mv, c = make()
    A = list(range(12))
    put(a, mv, c, A)
    c.evict(3)
    mine = compute(a, mv, c, A + [7] * 4)  # computed A itself, e.g. admitted before A cached
    r = c.insert(A + [7] * 4, mine)
    assert (r.num_cached_tokens, r.num_new_pages) == (12, 1)
    assert c.num_cached_pages == 4 and [a.refcount(p) for p in mine] == [1] * 4
    m = c.match_prefix(A + [7] * 4)
    assert m.pages == mine and c.num_loads == 0
    c.check_integrity()


def test_reset_waits_for_loads_and_empties_both_tiers() -> None:
    a, mv, c = make()
    A, B = list(range(8)), list(range(20, 32))
    put(a, mv, c, A)
    c.evict(2)
    kept = put(a, mv, c, B)
    a.incref(kept)  # a request still uses B
    assert c.match_prefix(A).num_tokens == 8  # load in flight
    assert c.reset() == 2
    assert not mv.pending and c.num_host_pages == 0 and c.num_cached_pages == 3
    c.check_integrity()
    a.decref(kept)
    assert c.reset() == 3 and a.num_free == 16
    c.check_integrity()


@pytest.mark.parametrize("seed", range(6))
def test_random_operations_keep_integrity_and_contents(seed: int) -> None:
    rng = random.Random(seed)
    a, mv, c = make(num_pages=rng.choice([12, 24]), host_slots=rng.choice([4, 16, 48]))
    prefixes = [[rng.randrange(50) for _ in range(rng.randint(0, 20))] for _ in range(3)]
    users: list[tuple[list[int], list[int]]] = []  # live "requests": tokens, held pages
    for _ in range(150):
        op = rng.random()
        if op < 0.55:
            toks = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randint(0, 24))]
            m = c.match_prefix(toks)
            a.incref(m.pages)
            assert_holds(mv, m.pages, toks)
            pages = compute(a, mv, c, toks, m.pages)
            if pages is None:
                a.decref(m.pages)
            else:
                users.append((toks, pages))
        elif op < 0.85 and users:
            toks, pages = users.pop(rng.randrange(len(users)))
            c.insert(toks[: len(pages) * P], pages)
        elif op < 0.95:
            c.evict(rng.randint(1, 8))
        else:
            for toks, pages in users:
                c.insert(toks[: len(pages) * P], pages)
            users = []
            c.reset()
            assert a.num_free == a.num_pages and c.num_host_pages == 0
        if rng.random() < 0.5:
            mv.land()
        c.check_integrity()
        for toks, pages in users:
            assert_holds(mv, pages, toks)


# ---- under the scheduler: aborts (also while a load is in flight) and preemption ----------

VOCAB = 1000


class GatedModel:
    """Lands the loads of a batch's pages first (the gate), then checks that every earlier
    position of each request reads back its token and writes the new ones."""

    def __init__(self, mover: FakeMover) -> None:
        self.mv = mover

    def run(self, batch: ScheduledBatch) -> dict[str, int]:
        entries = [e for e in batch.entries if not e.req.state.done]  # aborted since schedule()
        self.mv.land({p for e in entries for p in e.req.pages})
        out: dict[str, int] = {}
        for e in entries:
            r, toks = e.req, e.req.tokens
            for pos in range(e.start_pos):
                assert self.mv.device[r.pages[pos // P]][pos % P] == toks[pos], (r.rid, pos)
            for i, t in enumerate(e.token_ids):
                pos = e.start_pos + i
                self.mv.device.setdefault(r.pages[pos // P], {})[pos % P] = t
            if e.sample:
                out[r.rid] = (e.token_ids[-1] + 1) % VOCAB
        return out


@pytest.mark.parametrize("seed", range(6))
def test_scheduler_on_hicache_with_aborts_mid_load_keeps_integrity(seed: int) -> None:
    rng = random.Random(seed)
    pages = rng.choice([20, 32])
    cfg = EngineConfig(
        model=ModelConfig(csa_rate=2, hca_rate=4, window=8, max_context=4096),
        page_size=P,
        num_pages=pages,
        chunked_prefill_tokens=rng.choice([8, 32]),
        max_running_requests=rng.choice([4, 16]),
        hicache=True,
    )
    a, mv = PageAllocator(pages), FakeMover(rng.choice([8, 64]))
    s = Scheduler(cfg, a, HiRadixCache(P, a, mv), eos_token_id=VOCAB - 1)
    model = GatedModel(mv)
    # agent-like: sessions whose next prompt extends the last one
    sessions = [[rng.randrange(800) for _ in range(rng.randint(4, 30))] for _ in range(10)]
    live: list[Request] = []
    for i in range(120):
        if rng.random() < 0.6:
            k = rng.randrange(len(sessions))
            grown = sessions[k] + [rng.randrange(800) for _ in range(rng.randint(1, 12))]
            sessions[k] = grown if len(grown) < 60 else grown[: rng.randint(1, 12)]
            r = Request(f"r{i}", list(sessions[k]), SamplingParams(max_tokens=rng.randint(1, 6)))
            s.add(r)
            live.append(r)
        batch = s.schedule()
        s.check_integrity()
        if live and rng.random() < 0.2:  # between schedule and run: its load may be in flight
            victim = rng.choice(live)
            s.abort(victim.rid)
            s.check_integrity()
        if batch is not None:
            s.postprocess(batch, model.run(batch))
            s.check_integrity()
        if rng.random() < 0.3:
            mv.land()  # loads nobody waited for finish in their own time
        live = [r for r in live if not r.state.done]
    for _ in range(5000):
        if not s.has_work:
            break
        batch = s.schedule()
        if batch is None:  # only pages pinned by loads of aborted requests were in the way
            assert mv.pending, "work left but nothing scheduled: deadlock"
            mv.land()  # as time passes, the loader finishes them
            continue
        s.postprocess(batch, model.run(batch))
        s.check_integrity()
    assert not s.has_work
    assert all(r.state in (RequestState.FINISHED, RequestState.ABORTED) for r in live)
    assert s.cache.num_loads > 0, "the workload never loaded from the host tier"
    s.cache.reset()
    assert a.num_free == pages and s.cache.num_host_pages == 0
    s.check_integrity()
