"""HiCache's data plane: host copies of KV pages, and the loader thread that brings them back
into the device pools layer by layer while the model runs (the `PageMover` of
hiradix_cache.py).

Why layer by layer: a request whose prefix comes back from host memory should not wait for the
whole prefix before its prefill starts. The loader copies every page's layer-0 tensors first,
then layer 1's, and so on; the forward pass starts at once and, before it reads a layer's pools,
waits at that layer's gate (KVPools.gate) until the layer has landed. Loading layer l + 1
overlaps computing layer l.

Why a modelled link: on a GPU the copy crosses PCIe; here both tiers are host memory and a copy
takes microseconds, which would hide every timing effect a deployment has. So the loader paces
itself to `hicache_load_gbps`: a layer's tensor lands only once its bytes would have crossed the
link, and a layer takes (pages x that layer's bytes per page) / bandwidth, as over PCIe. Within
a layer, tensors go in KVPools.layer_tensors order: raw KV, compressed KV, then index keys and
their scales, so a layer's index keys land last. Backups (device -> host, on eviction) are
plain copies on the engine thread: they finish before the evicted page ids can be reused, and
pacing them would only stall the scheduler, not any reader.

The planted fault `hicache-index-race` removes the wait from the index-K read path (the
indexer's read, which comes before attention's KV read in a layer), as in SGLang before its
index-K buffer accessor got `wait_layer_transfer`. A query that reaches layer l while layer l is
still in flight scores the index keys its freshly allocated pages held before (another
sequence's, evicted a moment ago) and selects the wrong blocks. The window is the time from a
reader's arrival to the landing of the layer's index keys; bf16 index keys (twice fp8's bytes)
push every landing later. `unguarded_reads` counts index-K reads (one per indexer call) that
went ahead while a load had not landed their layer: an upper bound on the stale ones, since a
batch's other sequences read their own, settled pages.
"""

from __future__ import annotations

import logging
import queue
import threading
import time

import torch

from .config import EngineConfig
from .faults import Fault
from .model.kv_pools import KVPools

log = logging.getLogger("dsv4bench.engine")


class LayerLoad:
    """One batch of pages coming back from the host tier. `landed(l)` once every tensor of
    layer l is in the device pools; done once the last layer is."""

    def __init__(self, host_slots: list[int], device_pages: list[int], num_layers: int) -> None:
        assert len(host_slots) == len(device_pages)
        self.host_slots = host_slots
        self.device_pages = device_pages
        self._landed = [threading.Event() for _ in range(num_layers)]
        self.error: BaseException | None = None

    def landed(self, layer: int) -> bool:
        return self._landed[layer].is_set()

    def done(self) -> bool:
        return self._landed[-1].is_set()

    def wait(self, layer: int) -> None:
        """Block until layer `layer` has landed. Raises RuntimeError if the loader failed."""
        self._landed[layer].wait()
        if self.error is not None:
            raise RuntimeError(f"host tier load failed: {self.error!r}")

    def mark_landed(self, layer: int) -> None:
        self._landed[layer].set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        for ev in self._landed:
            ev.set()


class HostTier:
    """Host buffers shaped like the device pools' pages, the loader thread, and the per-layer
    gate; installs itself as `pools.gate`. Host slots are handed out by the cache
    (HiRadixCache.host_slots); this class only moves bytes."""

    def __init__(self, pools: KVPools, cfg: EngineConfig) -> None:
        assert cfg.hicache_load_gbps > 0
        self.pools = pools
        self.num_slots = cfg.hicache_host_pages or 2 * cfg.num_pages
        self.bytes_per_s = cfg.hicache_load_gbps * 1e9
        self.index_k_gated = Fault.HICACHE_INDEX_RACE not in cfg.faults
        pin = pools.kv[0].device.type == "cuda"
        # Per layer, (device pool, host buffer) pairs viewed as bytes: one copy path for
        # float32, bf16 and fp8 (whose CPU index_copy_ is missing).
        self.layers: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
        for l in range(len(pools.kv)):
            pairs = []
            for t in pools.layer_tensors(l):
                dev = t.view(torch.uint8)
                host = torch.empty((self.num_slots, *dev.shape[1:]), dtype=torch.uint8, pin_memory=pin)
                pairs.append((dev, host))
            self.layers.append(pairs)
        self.layer_bytes_per_page = [sum(d[0].numel() for d, _ in pairs) for pairs in self.layers]
        self.num_loads = 0
        self.bytes_loaded = 0
        self.unguarded_reads = 0
        self.failure: BaseException | None = None  # the loader's first error; every gate raises it
        self._inflight: list[LayerLoad] = []
        self._lock = threading.Lock()
        self._queue: queue.Queue[LayerLoad | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="dsv4-hicache-loader", daemon=True)
        self._thread.start()
        pools.gate = self.gate

    # ---- the engine thread's side --------------------------------------------------------

    def backup(self, device_pages: list[int], host_slots: list[int]) -> None:
        """Copy device pages into host slots, every layer, now."""
        pages = torch.tensor(device_pages, dtype=torch.long, device=self.pools.kv[0].device)
        slots = torch.tensor(host_slots, dtype=torch.long)
        for pairs in self.layers:
            for dev, host in pairs:
                host.index_copy_(0, slots, dev.index_select(0, pages).cpu())

    def load(self, host_slots: list[int], device_pages: list[int]) -> LayerLoad:
        """Queue a load of host slots onto device pages; the loader starts on it at once."""
        batch = LayerLoad(list(host_slots), list(device_pages), len(self.layers))
        with self._lock:
            self._inflight.append(batch)
        self.num_loads += 1
        self._queue.put(batch)
        return batch

    def gate(self, layer: int, what: str) -> None:
        """KVPools.gate: wait until every load in flight has landed `layer`."""
        if self.failure is not None:
            raise RuntimeError(f"host tier load failed: {self.failure!r}")
        with self._lock:
            pending = [b for b in self._inflight if not b.landed(layer)]
        if not pending:
            return
        if what == "index_k" and not self.index_k_gated:
            self.unguarded_reads += 1
            return
        for b in pending:
            b.wait(layer)

    def loads_in_flight(self) -> int:
        """Loads whose last layer has not landed. NOTE: counted by the layer events, not by
        `_inflight`, which the loader thread prunes only after the last event is set: right
        after `wait_all` returns, a finished load may still be listed there."""
        with self._lock:
            return sum(not b.done() for b in self._inflight)

    def wait_all(self) -> None:
        with self._lock:
            pending = list(self._inflight)
        for b in pending:
            b.wait(len(self.layers) - 1)

    def close(self) -> None:
        """Stop the loader thread after the loads already queued."""
        self._queue.put(None)
        self._thread.join(timeout=30)

    # ---- the loader thread -----------------------------------------------------------------

    def _run(self) -> None:
        while True:
            batch = self._queue.get()
            if batch is None:
                return
            try:
                with torch.no_grad():
                    self._transfer(batch)
            except Exception as e:  # the gate re-raises it in the engine thread
                log.exception("host tier load failed")
                self.failure = e
                batch.fail(e)
            finally:
                with self._lock:
                    self._inflight.remove(batch)

    def _transfer(self, batch: LayerLoad) -> None:
        device = self.pools.kv[0].device
        pages = torch.tensor(batch.device_pages, dtype=torch.long, device=device)
        slots = torch.tensor(batch.host_slots, dtype=torch.long)
        n = len(batch.device_pages)
        arrival = time.monotonic()  # when the bytes sent so far have crossed the link
        for l, pairs in enumerate(self.layers):
            for dev, host in pairs:
                nbytes = n * dev[0].numel()
                arrival += nbytes / self.bytes_per_s
                delay = arrival - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                dev.index_copy_(0, pages, host.index_select(0, slots).to(device))
                self.bytes_loaded += nbytes
            if device.type == "cuda":
                torch.cuda.current_stream(device).synchronize()
            batch.mark_landed(l)
