"""`ServingEngine`: what the HTTP layer (engine/server.py, engine/generations.py) needs of an engine.

Implemented by the unified engine (`unified_engine.AsyncEngine`), the PD router
(`pd.router.PDRouter`) and the tests' scripted stand-in (`tests/engine/fake_engine.py`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Protocol

from .config import EngineConfig
from .outputs import TokenEventLike
from .prepared_request import Bootstrap
from .request import SamplingParams

if TYPE_CHECKING:
    from .server_loop import EngineStats


class ServingEngine(Protocol):
    """An engine as the server sees it. Every method may be called from the server's event loop
    thread; `abort` and `alive` from any thread."""

    cfg: EngineConfig  # feeds /get_server_info, `sglang:num_used_tokens` and the planted faults
    max_context: int  # the longest prompt + output the engine takes, in tokens
    eos_token_id: int

    def generate(
        self, rid: str, prompt_ids: list[int], params: SamplingParams, bootstrap: Bootstrap | None = None
    ) -> AsyncIterator[TokenEventLike]:
        """Yield the request's output events, the last one with a finish reason; closing the
        generator before that aborts the request and frees what it holds. `bootstrap` is a
        PD router's room for the request: a prefill or decode server's half needs it, the
        others leave it, as SGLang's servers do."""
        ...

    def abort(self, rid: str) -> bool:
        """Abort request `rid` without waiting; True when it was in flight."""
        ...

    def stats(self) -> EngineStats:
        """A snapshot of the engine's gauges and counters (the /metrics source)."""
        ...

    def flush_cache(self) -> bool:
        """Drop the prefix cache when nothing is running; False otherwise."""
        ...

    def alive(self) -> bool:
        """The liveness flag: the engine's threads run (says nothing of whether it can serve)."""
        ...
