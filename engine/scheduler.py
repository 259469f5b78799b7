"""Continuous batching with chunked prefill, prefix sharing, preemption and abort in any state.

Torch-free. The engine loop (one thread) owns the scheduler and calls, per step:
`schedule()` -> run the model on the batch -> sample -> `postprocess()`; `add()` and `abort()`
between steps; `check_integrity()` whenever idle. Nothing here is thread-safe.

Priority is arrival order (`add` order): an admitted request may preempt only requests that
arrived after it, so the oldest admitted request always progresses and nothing deadlocks.
"""

from __future__ import annotations

import bisect
import time
from collections import Counter
from typing import NamedTuple

from .config import EngineConfig
from .memory import PageAllocator
from .radix_cache import RadixCache
from .request import FinishReason, Request, RequestState, is_health_probe


class BatchEntry(NamedTuple):
    req: Request
    start_pos: int  # position of token_ids[0]; == req.num_computed when scheduled
    token_ids: list[int]  # decode: [last sampled token]; prefill: the next chunk
    sample: bool  # logits of the last token must be sampled (decode, or a chunk ending the input)


class ScheduledBatch(NamedTuple):
    """One step's work. The first `num_decode` entries are decode entries (one token each),
    the rest prefill chunks. KV of entry tokens goes to `req.pages` at positions
    `start_pos ..`; the pages are already reserved."""

    entries: list[BatchEntry]
    num_decode: int
    num_prefill_tokens: int

    @property
    def num_tokens(self) -> int:
        return self.num_decode + self.num_prefill_tokens


class OutputEvent(NamedTuple):
    rid: str
    new_token_id: int | None
    finish_reason: FinishReason | None


class KVPoolStats(NamedTuple):
    """The device KV pool in tokens, under SGLang's meanings (its SchedulerStats):
    used + evictable + available == max_total_num_tokens."""

    max_total_num_tokens: int = 0  # the pool: num_pages * page_size
    used_tokens: int = 0  # on pages a request holds (cached pages it shares included)
    evictable_tokens: int = 0  # on cached pages no request holds
    available_tokens: int = 0  # on free pages
    evicted_tokens_total: int = 0  # taken off the device by eviction, since the start


class CacheHit(NamedTuple):
    """Where an admitted request's cached prompt tokens were found (SGLang's
    `cached_tokens_details`); device + host == the request's `num_cached`."""

    device: int  # already on the device
    host: int  # loaded back from the host tier (HiCache) for this request


class SchedulerStats(NamedTuple):
    num_running: int  # decoding
    num_prefill: int  # admitted, input not yet fully computed
    num_waiting: int  # queued (includes preempted requests)
    pages_used: int  # refcount > 0, cache included
    pages_free: int
    pages_total: int
    token_usage: float  # pages held by requests (not evictable cache) / total, SGLang's meaning
    cache_hit_rate: float  # input tokens served from the cache / input tokens, over admissions
    num_cached_pages: int
    num_preemptions: int
    kv: KVPoolStats


class Scheduler:
    """Owns the request queues. Mutates requests, allocator refcounts and the radix cache."""

    def __init__(
        self, engine_cfg: EngineConfig, allocator: PageAllocator, cache: RadixCache, eos_token_id: int
    ) -> None:
        assert cache.allocator is allocator and cache.page_size == engine_cfg.page_size
        assert engine_cfg.chunked_prefill_tokens >= 1 and engine_cfg.max_running_requests >= 1
        self.cfg = engine_cfg
        self.page_size = engine_cfg.page_size
        self.allocator = allocator
        self.cache = cache
        self.eos_token_id = eos_token_id
        # NOTE: capped by the pool so that the oldest request, alone, always fits.
        self.max_seq_len = min(engine_cfg.model.max_context, allocator.num_pages * self.page_size)
        self.waiting: list[Request] = []  # sorted by arrival
        self.admitted: list[Request] = []  # PREFILL and RUNNING, sorted by arrival
        self._live: dict[str, Request] = {}
        self._seq: dict[str, int] = {}
        self._next_seq = 0
        self._preempted_this_step = False
        self._input_tokens = 0
        self._cached_tokens = 0
        self._num_preemptions = 0
        self._cache_hits: dict[str, CacheHit] = {}  # live admitted requests' latest admission

    # ---- queue changes -------------------------------------------------------------------

    def add(self, req: Request) -> None:
        """Queue a fresh WAITING request. Raises ValueError for a duplicate live rid, an empty
        prompt, or a prompt of `max_seq_len` tokens or more (no room for one output token)."""
        assert req.state is RequestState.WAITING and not req.pages and req.num_computed == 0
        if req.rid in self._live:
            raise ValueError(f"request id {req.rid!r} is already live")
        if not 1 <= len(req.prompt_ids) < self.max_seq_len:
            raise ValueError(f"prompt of {len(req.prompt_ids)} tokens; limit {self.max_seq_len - 1}")
        self._live[req.rid] = req
        self._seq[req.rid] = self._next_seq
        self._next_seq += 1
        self.waiting.append(req)

    def add_prefilled(self, req: Request) -> FinishReason | None:
        """Admit a request whose prompt KV is already in `req.pages` and whose first output
        token was sampled elsewhere (PD decode: both come from the prefill server) straight
        into RUNNING. Returns the finish reason when that token already ends it (its pages are
        then released), else None. Raises ValueError like `add`; the caller guarantees a free
        running slot."""
        assert req.state is RequestState.WAITING and len(req.output_ids) == 1
        assert req.num_computed == len(req.prompt_ids) <= len(req.pages) * self.page_size
        assert len(self.admitted) < self.cfg.max_running_requests
        if req.rid in self._live:
            raise ValueError(f"request id {req.rid!r} is already live")
        if not 1 <= len(req.prompt_ids) < self.max_seq_len:
            raise ValueError(f"prompt of {len(req.prompt_ids)} tokens; limit {self.max_seq_len - 1}")
        req.transition(RequestState.PREFILL)
        reason = self._finish_reason(req, req.output_ids[0])
        if reason is not None:
            self._release(req)
            req.finish_reason = reason
            req.transition(RequestState.FINISHED)
            return reason
        self._live[req.rid] = req
        self._seq[req.rid] = self._next_seq
        self._next_seq += 1
        req.transition(RequestState.RUNNING)
        bisect.insort(self.admitted, req, key=self._key)
        return None

    def abort(self, rid: str) -> bool:
        """Abort a live request in any state: its full computed pages go to the cache, every
        other page is freed now, state ABORTED, finish_reason ABORT. Safe between schedule()
        and postprocess() (postprocess skips it). Returns False for an unknown/finished rid."""
        req = self._live.get(rid)
        if req is None:
            return False
        if req.state is RequestState.WAITING:
            self.waiting.remove(req)
        else:
            self.admitted.remove(req)
            self._release(req)
        req.finish_reason = FinishReason.ABORT
        req.transition(RequestState.ABORTED)
        self._forget(req)
        return True

    def _forget(self, req: Request) -> None:
        del self._live[req.rid]
        del self._seq[req.rid]
        self._cache_hits.pop(req.rid, None)

    def _key(self, req: Request) -> int:
        return self._seq[req.rid]

    def _release(self, req: Request) -> None:
        """Full pages of computed tokens go to the radix cache; the caller's other page
        references are dropped. Leaves `req.pages` empty."""
        n_full = min(req.num_computed // self.page_size, len(req.pages))
        rest = req.pages
        if self.cfg.enable_prefix_cache and n_full > 0:
            self.cache.insert(req.tokens[: n_full * self.page_size], req.pages[:n_full])
            rest = req.pages[n_full:]
        self.allocator.decref(rest)
        req.pages = []
        req.shared_pages = 0

    def _preempt(self, req: Request) -> None:
        """Back to WAITING holding nothing; its tokens (prompt + output) are kept and
        re-prefilled on re-admission, mostly from the cache if its pages survive there."""
        self.admitted.remove(req)
        self._release(req)
        req.num_computed = 0
        req.transition(RequestState.WAITING)
        bisect.insort(self.waiting, req, key=self._key)
        self._num_preemptions += 1
        self._preempted_this_step = True

    def _reserve(self, req: Request, num_positions: int, may_preempt: bool) -> bool:
        """Make `req.pages` cover positions `0 .. num_positions - 1`: allocate, evicting cache
        leaves when short, then (if `may_preempt`) preempting admitted requests newer than
        `req`, newest first. Returns False when that is not enough: nothing is allocated to
        `req`, though evictions and preemptions already made stand."""
        need = max(0, -(-num_positions // self.page_size) - len(req.pages))
        while not self.allocator.can_alloc(need):
            if self.cache.evict(need - self.allocator.num_free) > 0:
                continue
            newest = self.admitted[-1] if self.admitted else None
            if not may_preempt or newest is None or self._key(newest) <= self._key(req):
                return False
            self._preempt(newest)
        req.pages.extend(self.allocator.alloc(need))
        return True

    # ---- the step ------------------------------------------------------------------------

    def schedule(self) -> ScheduledBatch | None:
        """Plan one step: a decode token for every RUNNING request, then prefill chunks of
        PREFILL requests and of newly admitted WAITING ones (FCFS) within
        `chunked_prefill_tokens`. Reserves every page the batch writes. Returns None when
        there is nothing to run.

        Mutates: request states/pages (admission, preemption), allocator, cache (match, evict,
        insert of preempted requests' pages).
        """
        self._preempted_this_step = False
        for req in [r for r in self.admitted if r.state is RequestState.RUNNING]:
            if req.state is RequestState.RUNNING and not self._reserve(req, req.num_computed + 1, True):
                self._preempt(req)  # NOTE: it is the newest admitted; no one else to take from

        budget = self.cfg.chunked_prefill_tokens
        plan: list[tuple[Request, int, int]] = []
        for req in [r for r in self.admitted if r.state is RequestState.PREFILL]:
            if budget <= 0:
                break
            n = min(req.num_tokens - req.num_computed, budget)
            if req.state is RequestState.PREFILL and self._reserve(req, req.num_computed + n, True):
                plan.append((req, req.num_computed, n))
                budget -= n

        # NOTE: no admission in a step that preempted: pages are short, and the victim would
        # only bounce straight back.
        while (
            self.waiting
            and budget > 0
            and not self._preempted_this_step
            and len(self.admitted) < self.cfg.max_running_requests
        ):
            n = self._admit(self.waiting[0], budget)
            if n == 0:
                break
            req = self.waiting.pop(0)
            plan.append((req, req.num_computed, n))
            budget -= n

        entries = [
            BatchEntry(r, r.num_computed, [r.output_ids[-1]], True)
            for r in self.admitted
            if r.state is RequestState.RUNNING
        ]
        num_decode = len(entries)
        prefill_tokens = 0
        for req, start, n in plan:
            if req.state is RequestState.PREFILL:  # not preempted later in this step
                toks = req.tokens[start : start + n]
                entries.append(BatchEntry(req, start, toks, start + n == req.num_tokens))
                prefill_tokens += n
        if not entries:
            return None
        return ScheduledBatch(entries, num_decode, prefill_tokens)

    def _admit(self, req: Request, budget: int) -> int:
        """Try to admit the head of the queue: share its cached prefix, reserve pages for its
        first chunk (evicting, never preempting). Returns the chunk length, 0 if it must wait."""
        loaded = 0
        if self.cfg.enable_prefix_cache:
            # NOTE: at most num_tokens - 1 so at least one token is computed and gives logits.
            m = self.cache.match_prefix(req.tokens, req.num_tokens - 1)
            self.allocator.incref(m.pages)  # hold them before _reserve can evict
            req.pages = list(m.pages)
            req.shared_pages = len(m.pages)
            req.num_computed = m.num_tokens
            loaded = m.num_loaded_tokens
        n = min(req.num_tokens - req.num_computed, budget)
        if not self._reserve(req, req.num_computed + n, may_preempt=False):
            # NOTE: pages this match loaded back stay in the cache, on the device: a later
            # admission of this request finds them there and reports them as device hits.
            self.allocator.decref(req.pages)
            req.pages, req.num_computed, req.shared_pages = [], 0, 0
            return 0
        req.num_cached = min(req.num_computed, len(req.prompt_ids))
        # The loaded tokens end the match; a re-admitted request's match may run past its
        # prompt into its output, which is not a cached prompt token.
        device = min(req.num_computed - loaded, req.num_cached)
        self._cache_hits[req.rid] = CacheHit(device, req.num_cached - device)
        self._input_tokens += req.num_tokens
        self._cached_tokens += req.num_computed
        req.transition(RequestState.PREFILL)
        bisect.insort(self.admitted, req, key=self._key)
        return n

    def postprocess(self, batch: ScheduledBatch, sampled: dict[str, int]) -> list[OutputEvent]:
        """Apply a finished step: every entry's tokens become computed; each `sample` entry
        appends `sampled[rid]` and may finish its request (EOS / stop token -> STOP;
        max_tokens or the context limit -> LENGTH). Finished requests release their pages
        (full computed pages to the cache). Entries whose request was aborted since
        `schedule()` are skipped. Returns one event per sampled token, in batch order."""
        events: list[OutputEvent] = []
        for e in batch.entries:
            req = e.req
            if req.state not in (RequestState.PREFILL, RequestState.RUNNING):
                continue
            assert req.num_computed == e.start_pos, f"{req.rid}: batch out of date"
            req.num_computed += len(e.token_ids)
            if not e.sample:
                continue
            tok = sampled[req.rid]
            if req.params.constraint is not None:
                forced = req.params.constraint.forced_next(req.output_ids)
                tok = tok if forced is None else forced
            req.output_ids.append(tok)
            assert req.num_computed == req.num_tokens - 1
            if req.first_token_at is None:
                req.first_token_at = time.monotonic()
            reason = self._finish_reason(req, tok)
            if reason is not None:
                self.admitted.remove(req)
                self._release(req)
                req.finish_reason = reason
                req.transition(RequestState.FINISHED)
                self._forget(req)
            elif req.state is RequestState.PREFILL:
                req.transition(RequestState.RUNNING)
            events.append(OutputEvent(req.rid, tok, reason))
        return events

    def _finish_reason(self, req: Request, tok: int) -> FinishReason | None:
        if tok == self.eos_token_id and not req.params.ignore_eos or tok in req.params.stop_token_ids:
            return FinishReason.STOP
        if len(req.output_ids) >= req.params.max_tokens or req.num_tokens >= self.max_seq_len:
            return FinishReason.LENGTH
        return None

    # ---- observation ---------------------------------------------------------------------

    @property
    def has_work(self) -> bool:
        return bool(self._live)

    def get(self, rid: str) -> Request | None:
        return self._live.get(rid)

    def cache_hit(self, rid: str) -> CacheHit:
        """Where a live request's cached prompt tokens were found at its latest admission
        (nothing cached for one never admitted)."""
        return self._cache_hits.get(rid, CacheHit(0, 0))

    def stats(self) -> SchedulerStats:
        used, total = self.allocator.num_used, self.allocator.num_pages
        evictable = self._evictable_pages()
        users = [r for r in self.admitted if not is_health_probe(r.rid)]  # gauges count user requests only
        running = sum(r.state is RequestState.RUNNING for r in users)
        return SchedulerStats(
            num_running=running,
            num_prefill=len(users) - running,
            num_waiting=sum(not is_health_probe(r.rid) for r in self.waiting),
            pages_used=used,
            pages_free=self.allocator.num_free,
            pages_total=total,
            token_usage=(used - evictable) / total,
            cache_hit_rate=self._cached_tokens / self._input_tokens if self._input_tokens else 0.0,
            num_cached_pages=self.cache.num_cached_pages,
            num_preemptions=self._num_preemptions,
            kv=KVPoolStats(
                max_total_num_tokens=total * self.page_size,
                used_tokens=(used - evictable) * self.page_size,
                evictable_tokens=evictable * self.page_size,
                available_tokens=self.allocator.num_free * self.page_size,
                evicted_tokens_total=self.cache.num_evicted_tokens,
            ),
        )

    def _evictable_pages(self) -> int:
        # NOTE: O(1). Only cached pages ever have two holders (a request's private pages have
        # one until insert() consumes them), so evictable = cached - shared. check_integrity
        # verifies this against the tree walk.
        return self.cache.num_cached_pages - self.allocator.num_shared

    def check_integrity(self) -> None:
        """Assert: every page's refcount equals the number of requests and cache nodes that
        hold it (so a page is free iff nobody holds it); queue states and ordering; each
        admitted request's pages cover its computed tokens and no more than its tokens."""
        self.allocator.check_integrity()
        self.cache.check_integrity()
        assert self._evictable_pages() == self.cache.evictable_pages()
        holders = Counter(self.cache.all_pages())
        for req in self.waiting:
            assert req.state is RequestState.WAITING and not req.pages and req.num_computed == 0
        for req in self.admitted:
            assert req.state in (RequestState.PREFILL, RequestState.RUNNING), req.state
            assert len(set(req.pages)) == len(req.pages), f"{req.rid} holds a page twice"
            assert req.num_computed <= len(req.pages) * self.page_size
            assert len(req.pages) <= -(-req.num_tokens // self.page_size), f"{req.rid} over-allocated"
            if req.state is RequestState.RUNNING:
                assert req.num_computed == req.num_tokens - 1
            else:
                assert req.num_computed < req.num_tokens
            holders.update(req.pages)
        seqs = [self._key(r) for r in self.waiting], [self._key(r) for r in self.admitted]
        assert all(s == sorted(s) for s in seqs), "queues out of arrival order"
        assert len(self.admitted) <= self.cfg.max_running_requests
        assert {r.rid for r in self.waiting + self.admitted} == set(self._live)
        assert len(self.waiting) + len(self.admitted) == len(self._live)
        for p in range(self.allocator.num_pages):
            assert self.allocator.refcount(p) == holders[p], (
                f"page {p}: refcount {self.allocator.refcount(p)}, holders {holders[p]}"
            )
