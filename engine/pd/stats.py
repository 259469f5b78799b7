"""What the prefill and the decode engine publish: EngineStats plus the PD queues."""

from __future__ import annotations

from dataclasses import dataclass

from ..server_loop import EngineStats


@dataclass
class PDStats(EngineStats):
    """EngineStats plus the PD queues (metrics.py exports them under SGLang's names)."""

    num_prefill_bootstrap_queue: int = 0
    num_prefill_inflight_queue: int = 0
    num_decode_prealloc_queue: int = 0
    num_decode_transfer_queue: int = 0
    num_cached_pages: int = 0

    @property
    def in_flight(self) -> int:
        """User requests anywhere in this server."""
        return (
            self.num_running
            + self.num_queued
            + self.num_prefill
            + self.num_prefill_bootstrap_queue
            + self.num_prefill_inflight_queue
            + self.num_decode_prealloc_queue
            + self.num_decode_transfer_queue
        )

    @property
    def leaked_pages(self) -> int:
        """Pages in use beyond the prefix cache: a leak when nothing is in flight."""
        return self.pages_used - self.num_cached_pages
