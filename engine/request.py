"""A request inside the engine: what it asks for, where it is in its lifecycle, what it holds."""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol


class RequestState(enum.Enum):
    """Lifecycle of a request (engine/STRUCTURE.md, "Request lifecycle")."""

    WAITING = "waiting"  # queued, holds nothing
    PREFILL = "prefill"  # admitted, prompt partly computed, holds pages
    RUNNING = "running"  # decoding one token per step
    FINISHED = "finished"
    ABORTED = "aborted"

    @property
    def done(self) -> bool:
        return self in (RequestState.FINISHED, RequestState.ABORTED)

    def can_become(self, new: RequestState) -> bool:
        return new in _TRANSITIONS[self]


# NOTE: PREFILL/RUNNING -> WAITING is preemption (pages freed, tokens kept, re-prefilled later);
# PREFILL -> FINISHED happens when the first sampled token already ends the request.
_TRANSITIONS: dict[RequestState, frozenset[RequestState]] = {
    RequestState.WAITING: frozenset({RequestState.PREFILL, RequestState.ABORTED}),
    RequestState.PREFILL: frozenset(
        {RequestState.RUNNING, RequestState.WAITING, RequestState.FINISHED, RequestState.ABORTED}
    ),
    RequestState.RUNNING: frozenset({RequestState.WAITING, RequestState.FINISHED, RequestState.ABORTED}),
    RequestState.FINISHED: frozenset(),
    RequestState.ABORTED: frozenset(),
}


# NOTE: /health sends a real one-token request under this rid prefix (SGLang's own is
# "HEALTH_CHECK"). It is the server's traffic, not a user's: the request counters and queue
# gauges leave it out, or every poll would read as progress to a wedge check.
HEALTH_PROBE_PREFIX = "HEALTH_CHECK_"


def is_health_probe(rid: str) -> bool:
    return rid.startswith(HEALTH_PROBE_PREFIX)


class FinishReason(str, enum.Enum):
    STOP = "stop"  # EOS or a stop token
    LENGTH = "length"  # max_tokens or the context limit
    ABORT = "abort"


SEED_MAX = 2**63 - 1  # what a torch.Generator and deepseek-recipe both take


class DecodingConstraint(Protocol):
    """What a request's answer must keep to beyond its sampling (engine/tool_choice_decoding.py):
    ids never sampled, and output ids forced by what came before."""

    banned_ids: tuple[int, ...]

    def forced_next(self, output_ids: Sequence[int]) -> int | None: ...


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False  # EOS does not finish the request (SGLang's flag); its caller ends it
    constraint: DecodingConstraint | None = None  # tool_choice / parallel_tool_calls (chat only)

    def __post_init__(self) -> None:
        # NOTE: the loop samples with these; a value that passed here must not raise there.
        if type(self.max_tokens) is not int or self.max_tokens < 1:
            raise ValueError("max_tokens must be an integer of at least 1")
        if not 0.0 <= self.temperature <= 2.0:  # NaN fails too
            raise ValueError("temperature must be in [0, 2]")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1]")
        if self.seed is not None and (type(self.seed) is not int or not 0 <= self.seed <= SEED_MAX):
            raise ValueError(f"seed must be an integer in [0, {SEED_MAX}]")


class RequestFailure(Exception):
    """Some requests of a step failed on their own (their sampling raised, say) while the others
    were served: `failed` maps each failed rid to its error, `sampled` holds the others' tokens.
    The loop ends the failed requests with an error and goes on (server_loop.run_batch)."""

    def __init__(self, failed: dict[str, BaseException], sampled: dict[str, int]) -> None:
        super().__init__(
            f"{len(failed)} request(s) failed: "
            + ", ".join(f"{rid}: {type(e).__name__}: {e}" for rid, e in failed.items())
        )
        self.failed, self.sampled = failed, sampled


@dataclass(eq=False)
class Request:
    """One generation. `tokens` = prompt + output; `num_computed` of them have KV in `pages`."""

    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    state: RequestState = RequestState.WAITING
    output_ids: list[int] = field(default_factory=list)
    pages: list[int] = field(default_factory=list)  # page table: pages[i] holds positions i*P .. i*P+P-1
    num_computed: int = 0  # tokens whose KV is written into `pages`
    num_cached: int = 0  # prompt tokens served from the prefix cache
    shared_pages: int = 0  # the first `shared_pages` pages are borrowed from the radix cache
    finish_reason: FinishReason | None = None
    arrival: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None

    @property
    def tokens(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def prefill_done(self) -> bool:
        return self.num_computed >= len(self.prompt_ids)

    def transition(self, new: RequestState) -> None:
        """Move to `new`, asserting the lifecycle allows it (RequestState transitions)."""
        assert self.state.can_become(new), f"request {self.rid}: illegal {self.state.name} -> {new.name}"
        self.state = new
