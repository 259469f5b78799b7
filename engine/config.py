"""Frozen configs of the engine, chained as ModelConfig -> EngineConfig. CLI defaults are read
from here so each default lives in one place."""

from __future__ import annotations

from dataclasses import dataclass, field

from .faults import FAULTS, Fault, parse_faults

# Who parses DSML tool calls out of the model's text: deepseek-recipe, or SGLang's own
# DeepSeek-V4 detector (engine/sglang_tool_calls.py), for SGLang's streaming shape.
TOOL_CALL_PARSERS = ("deepseek-recipe", "sglang")


@dataclass(frozen=True)
class ModelConfig:
    """DSV4-mini's shape. The default is small enough for 80 agent sessions on 2 CPU cores.

    Layer i is a CSA layer (compression rate `csa_rate`, lightning indexer, top-k) when i is
    even, an HCA layer (compression rate `hca_rate`, every compressed entry attended) when odd.
    Every layer also attends a sliding window of `window` raw tokens.
    """

    vocab_size: int = 8192
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4  # query heads; one shared KV head (MQA), K = V
    head_dim: int = 64
    rope_dim: int = 32  # partial RoPE: the first rope_dim dims of q and k rotate
    rope_theta: float = 10000.0
    window: int = 128
    csa_rate: int = 4
    hca_rate: int = 32
    index_heads: int = 4
    index_dim: int = 32
    index_topk: int = 32  # compressed entries a CSA query selects
    n_experts: int = 8
    experts_per_token: int = 2
    expert_dim: int = 256
    shared_expert_dim: int = 256
    router_score: str = "sigmoid"  # "sigmoid" (DeepSeek-V3/V4) or "softmax" router scores
    n_hash_layers: int = 1  # the first n layers route by a fixed hash of the token id
    tie_embeddings: bool = True  # lm_head shares the embedding matrix
    max_context: int = 16384
    norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        assert self.rope_dim <= self.head_dim and self.rope_dim % 2 == 0
        assert self.window >= self.hca_rate >= self.csa_rate >= 1
        assert self.hca_rate % self.csa_rate == 0
        assert 1 <= self.experts_per_token <= self.n_experts
        assert self.router_score in ("sigmoid", "softmax")
        assert 0 <= self.n_hash_layers <= self.n_layers

    def is_csa(self, layer: int) -> bool:
        return layer % 2 == 0

    def rate(self, layer: int) -> int:
        return self.csa_rate if self.is_csa(layer) else self.hca_rate


@dataclass(frozen=True)
class EngineConfig:
    """How the engine serves: memory, batching, device, index-K storage."""

    model: ModelConfig = field(default_factory=ModelConfig)
    device: str = "cpu"
    page_size: int = 32  # tokens per page; a multiple of hca_rate so compressed entries align
    num_pages: int = 32768
    max_running_requests: int = 128
    chunked_prefill_tokens: int = 2048  # prefill tokens per step, across requests
    index_k_dtype: str = "fp8"  # "fp8" (e4m3 + per-entry scale) or "bf16"
    enable_prefix_cache: bool = True
    # HiCache (hiradix_cache.py, host_tier.py): evicted prefix pages move to a host tier and
    # load back layer by layer. Host capacity in pages, 0 = twice num_pages (SGLang's default
    # host/device ratio); the host->device link's modelled bandwidth in GB/s.
    hicache: bool = False
    hicache_host_pages: int = 0
    hicache_load_gbps: float = 0.25
    pd: bool = False  # prefill/decode disaggregation (engine/pd/; its processes: DeploymentConfig)
    # Planted bug mechanisms (faults.py); empty = the clean engine. Names (as the CLI passes
    # them) or Fault members; __post_init__ makes them Faults.
    faults: frozenset[Fault] = frozenset()
    tool_call_parser: str = TOOL_CALL_PARSERS[0]  # one of TOOL_CALL_PARSERS

    def __post_init__(self) -> None:
        # User-facing settings: ValueError (not assert) so `engine serve` can say what is wrong.
        if self.page_size % self.model.hca_rate:
            raise ValueError(f"page size must be a multiple of the HCA rate {self.model.hca_rate}")
        if self.index_k_dtype not in ("fp8", "bf16"):
            raise ValueError("index-K dtype must be fp8 or bf16")
        if not (self.device in ("cpu", "cuda") or self.device.startswith("cuda:")):
            raise ValueError("device must be cpu or cuda")
        if self.tool_call_parser not in TOOL_CALL_PARSERS:
            raise ValueError(f"tool-call parser must be one of {', '.join(TOOL_CALL_PARSERS)}")
        object.__setattr__(self, "faults", parse_faults(self.faults))  # frozen: set once, here
        if self.hicache and not self.enable_prefix_cache:
            raise ValueError("HiCache needs the prefix cache")
        if self.hicache_host_pages < 0 or not self.hicache_load_gbps > 0:
            raise ValueError("HiCache host pages must be >= 0 and the load bandwidth > 0")
        for fault in sorted(self.faults):
            if FAULTS[fault].needs == "hicache" and not self.hicache:
                raise ValueError(f"fault {fault} needs HiCache (--hicache)")
            if FAULTS[fault].needs == "pd" and not self.pd:
                raise ValueError(f"fault {fault} needs PD mode (--pd)")
        if self.pd and self.hicache:
            raise ValueError("HiCache is not available in PD mode")


ROUTERS = ("bundled", "sglang")
ROUTER_PORT = 8000  # the router's port when --port is not given (SGLang's PD examples use it)


@dataclass(frozen=True)
class DeploymentConfig:
    """Where each part listens (the router: ServerConfig.port) and how the parts are joined."""

    router: str = "bundled"  # ours, or SGLang's ("sglang")
    prefill_port: int = 30000
    decode_port: int = 30002
    worker_port: int = 30000  # the unified engine's, behind SGLang's router without --pd
    bootstrap_port: int = 8998  # SGLang's --disaggregation-bootstrap-port default
    router_metrics_port: int = 29000  # SGLang's router's --prometheus-port default
    # NOTE: KV transfer bandwidth (0 = memory speed), scaled to this engine: a prompt's KV
    # takes a fraction of a decode step to move, as over RDMA between real PD servers.
    link_gbps: float = 0.1
    # NOTE: under the 5 s a probing client (the harness) waits, so it hears the 503.
    health_timeout_s: float = 4.0
    startup_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.router not in ROUTERS:
            raise ValueError(f"the router is {' or '.join(ROUTERS)}, not {self.router!r}")
        for name in ("prefill_port", "decode_port", "worker_port", "bootstrap_port", "router_metrics_port"):
            if not 1 <= getattr(self, name) <= 65535:
                raise ValueError(f"the {name.replace('_', ' ')} must be in 1..65535")
        if self.link_gbps < 0:
            raise ValueError("the link bandwidth must be >= 0")
        if self.health_timeout_s <= 0:
            raise ValueError("the health timeout must be > 0")
