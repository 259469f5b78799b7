"""Paged KV pools of DSV4-mini (STRUCTURE.md "Memory layout"), one page id across all of them.

Per layer l:
- `kv[l]`   [num_pages, page_size, head_dim]          raw KV (K = V), stored without RoPE;
- `ckv[l]`  [num_pages, page_size // rate(l), head_dim] compressed entries;
- CSA layers only: `idx_k[l]` [num_pages, page_size // csa_rate, index_dim], float8_e4m3fn with
  `idx_scale[l]` float32 [num_pages, page_size // csa_rate] (per-entry absmax scale), or
  bfloat16 with the scale unused (EngineConfig.index_k_dtype == "bf16").

The model addresses pools through flat ids: slot = page * page_size + pos % page_size for raw KV,
entry = page * (page_size // rate) + (pos % page_size) // rate for compressed entries and index
keys. `gate(layer, what)` is called by the model before it reads a layer's pools: "index_k"
before the indexer reads index keys, then "kv" before attention reads raw and compressed KV.
The host tier (engine/host_tier.py) installs a gate that waits until the layer's pages being
loaded from host memory have landed. The default gate does nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..config import EngineConfig
from ..kernels import load_triton

FP8_MAX = 448.0  # largest finite float8_e4m3fn


def quantize_index_k(k: torch.Tensor, mode: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Index keys [..., index_dim] -> (stored, scale). fp8: per-entry absmax scale so the entry's
    largest |value| maps to 448; bf16: plain cast, scale None."""
    if mode == "bf16":
        return k.to(torch.bfloat16), None
    assert mode == "fp8", mode
    scale = (k.abs().amax(dim=-1).float() / FP8_MAX).clamp(min=1e-12)
    stored = (k.float() / scale.unsqueeze(-1)).to(torch.float8_e4m3fn)
    return stored, scale


def dequantize_index_k(stored: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """Inverse of quantize_index_k, as float32."""
    if scale is None:
        return stored.float()
    return stored.float() * scale.unsqueeze(-1)


def roundtrip_index_k(k: torch.Tensor, mode: str) -> torch.Tensor:
    """What a reader of the pool sees for keys k: the dense path uses it to match the pools."""
    return dequantize_index_k(*quantize_index_k(k, mode)).to(k.dtype)


class KVPools:
    """All paged tensors of the model; see the module docstring for layout and addressing."""

    def __init__(
        self,
        cfg: EngineConfig,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        scratch_page: bool = False,
    ) -> None:
        m = cfg.model
        self.cfg = cfg
        self.page_size = cfg.page_size
        self.num_pages = cfg.num_pages
        self.index_k_dtype = cfg.index_k_dtype
        P, n = cfg.page_size, cfg.num_pages
        # NOTE: with scratch_page, every pool has one page more (id num_pages) that no
        # allocator hands out: static-shape decode steps (CUDA graphs) send the writes of
        # padding rows and of blocks not yet complete there.
        self.scratch_page: int | None = n if scratch_page else None
        n += int(scratch_page)
        assert P % m.hca_rate == 0 and P % m.csa_rate == 0
        # NOTE: zero-initialised: masked reads gather real (finite) rows, and 0 * NaN would
        # poison an attention output even at probability 0.
        self.kv = [torch.zeros(n, P, m.head_dim, dtype=dtype, device=device) for _ in range(m.n_layers)]
        self.ckv = [torch.zeros(n, P // m.rate(l), m.head_dim, dtype=dtype, device=device) for l in range(m.n_layers)]
        self.idx_k: list[torch.Tensor | None] = []
        self.idx_scale: list[torch.Tensor | None] = []
        k_dtype = torch.float8_e4m3fn if cfg.index_k_dtype == "fp8" else torch.bfloat16
        for l in range(m.n_layers):
            if m.is_csa(l):
                entries = P // m.csa_rate
                self.idx_k.append(torch.zeros(n, entries, m.index_dim, dtype=k_dtype, device=device))
                self.idx_scale.append(torch.ones(n, entries, dtype=torch.float32, device=device))
            else:
                self.idx_k.append(None)
                self.idx_scale.append(None)
        self.gate: Callable[[int, str], None] = lambda layer, what: None

    # --- flat views (what the model and the kernels index) ---------------------------------
    def kv_flat(self, layer: int) -> torch.Tensor:
        return self.kv[layer].view(-1, self.kv[layer].shape[-1])

    def ckv_flat(self, layer: int) -> torch.Tensor:
        return self.ckv[layer].view(-1, self.ckv[layer].shape[-1])

    def idx_flat(self, layer: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(index keys [entries, index_dim], scales [entries] or None for bf16)."""
        k, s = self.idx_k[layer], self.idx_scale[layer]
        assert k is not None and s is not None, f"layer {layer} has no indexer"
        return k.view(-1, k.shape[-1]), (s.view(-1) if self.index_k_dtype == "fp8" else None)

    # --- addressing -------------------------------------------------------------------------
    def slots(self, page_table: Sequence[int] | torch.Tensor, positions: torch.Tensor, rate: int = 1) -> torch.Tensor:
        """Flat ids of `positions` (rate 1: raw KV slots; rate r: the entries of the blocks
        holding those positions) for one sequence's page table."""
        pt = torch.as_tensor(page_table, dtype=torch.long, device=positions.device)
        per_page = self.page_size // rate
        return pt[positions // self.page_size] * per_page + (positions % self.page_size) // rate

    # --- raw KV -------------------------------------------------------------------------------
    def write_kv(self, layer: int, slots: torch.Tensor, values: torch.Tensor) -> None:
        _copy_rows(self.kv_flat(layer), slots, values)

    def read_kv(self, layer: int, slots: torch.Tensor) -> torch.Tensor:
        return self.kv_flat(layer)[slots]

    def write_kv_at(self, layer: int, page_table: Sequence[int], positions: torch.Tensor, values: torch.Tensor) -> None:
        self.write_kv(layer, self.slots(page_table, positions), values)

    def read_kv_at(self, layer: int, page_table: Sequence[int], positions: torch.Tensor) -> torch.Tensor:
        return self.read_kv(layer, self.slots(page_table, positions))

    # --- compressed entries and index keys ---------------------------------------------------
    def write_ckv(self, layer: int, entries: torch.Tensor, values: torch.Tensor) -> None:
        _copy_rows(self.ckv_flat(layer), entries, values)

    def read_ckv(self, layer: int, entries: torch.Tensor) -> torch.Tensor:
        return self.ckv_flat(layer)[entries]

    def fill_random(self, pages: list[int]) -> None:
        """Random contents for `pages` in every pool, as if their tokens had been prefilled: the
        benchmarks and the graph tests set up long contexts this way without a prefill."""
        idx = torch.tensor(pages, device=self.kv[0].device)
        for layer in range(len(self.kv)):
            self.kv[layer][idx] = torch.randn_like(self.kv[layer][idx])
            self.ckv[layer][idx] = torch.randn_like(self.ckv[layer][idx])
            k = self.idx_k[layer]
            if k is not None:
                keys = torch.randn(*k[idx].shape, device=k.device)
                flat = idx.unsqueeze(1) * k.shape[1] + torch.arange(k.shape[1], device=k.device)
                self.write_index_k(layer, flat.flatten(), keys.flatten(0, 1))

    def write_index_k(self, layer: int, entries: torch.Tensor, keys: torch.Tensor) -> None:
        """Quantize float keys [n, index_dim] into the layer's index-K pool."""
        self.write_index_k_stored(layer, entries, *quantize_index_k(keys, self.index_k_dtype))

    def write_index_k_stored(
        self, layer: int, entries: torch.Tensor, stored: torch.Tensor, scale: torch.Tensor | None
    ) -> None:
        """Write keys already quantized by quantize_index_k into the layer's index-K pool."""
        k_flat, s_flat = self.idx_flat(layer)
        if stored.dtype == torch.float8_e4m3fn:  # NOTE: index_copy_ has no fp8 CPU kernel
            _copy_rows(k_flat.view(torch.uint8), entries, stored.view(torch.uint8))
        else:
            _copy_rows(k_flat, entries, stored)
        if scale is not None:
            assert s_flat is not None
            _copy_rows(s_flat, entries, scale)

    def read_index_k(self, layer: int, entries: torch.Tensor) -> torch.Tensor:
        """Dequantized float32 index keys of `entries` (any shape) -> [*entries.shape, index_dim]."""
        k_flat, s_flat = self.idx_flat(layer)
        return dequantize_index_k(k_flat[entries], None if s_flat is None else s_flat[entries])

    def write_ckv_at(
        self, layer: int, page_table: Sequence[int], positions: torch.Tensor, values: torch.Tensor
    ) -> None:
        """Write compressed entries of the blocks holding `positions` (one position per block)."""
        rate = self.cfg.model.rate(layer)
        self.write_ckv(layer, self.slots(page_table, positions, rate), values)

    def read_ckv_at(self, layer: int, page_table: Sequence[int], positions: torch.Tensor) -> torch.Tensor:
        rate = self.cfg.model.rate(layer)
        return self.read_ckv(layer, self.slots(page_table, positions, rate))

    # --- whole pages (KV transfer, host tier) -------------------------------------------------
    def layer_tensors(self, layer: int) -> list[torch.Tensor]:
        """The layer's pooled tensors (first axis: page id): raw KV, compressed KV, then for
        CSA layers index keys and their scales."""
        k, s = self.idx_k[layer], self.idx_scale[layer]
        return [self.kv[layer], self.ckv[layer]] + ([k, s] if k is not None and s is not None else [])

    def page_tensors(self) -> list[torch.Tensor]:
        """Every pooled tensor whose first axis is the page id, in a fixed order (layer by
        layer, each in layer_tensors order)."""
        return [t for l in range(len(self.kv)) for t in self.layer_tensors(l)]

    def bytes_per_page(self) -> int:
        return sum(t[0].numel() * t.element_size() for t in self.page_tensors())

    def copy_page(self, src: int, dst: int) -> None:
        """Copy every pool's page `src` onto page `dst` (same pools)."""
        assert 0 <= src < self.num_pages and 0 <= dst < self.num_pages
        for t in self.page_tensors():
            t[dst].copy_(t[src])

    def read_page(self, page: int) -> list[torch.Tensor]:
        """Copies of page `page` of every pool (page_tensors order), e.g. for a host tier."""
        return [t[page].clone() for t in self.page_tensors()]

    def write_page(self, page: int, data: Sequence[torch.Tensor]) -> None:
        """Inverse of read_page; also the receiving end of a KV transfer between pools."""
        tensors = self.page_tensors()
        assert len(data) == len(tensors)
        for t, d in zip(tensors, data):
            t[page].copy_(d)


def _copy_rows(dst: torch.Tensor, index: torch.Tensor, src: torch.Tensor) -> None:
    """dst.index_copy_(0, index, src in dst's dtype): on CUDA by one Triton launch
    (kernels/scatter_rows.py says why), elsewhere by index_copy_."""
    mod = load_triton("scatter_rows") if dst.is_cuda else None
    if mod is None:
        dst.index_copy_(0, index, src.to(dst.dtype))
    else:
        mod.scatter_rows(dst, index, src)
