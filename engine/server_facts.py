"""What every server of the bundled engine (unified, PD router, prefill, decode) says about
itself on SGLang's informational endpoints: `/server_info` and `/model_info` (with the older
`/get_server_info` and `/get_model_info` aliases) and `/get_load`.

SGLang's router reads these when it registers a worker: the model id, the disaggregation mode,
and the tokenizer, which it loads from `model_path`. So `model_path` is the local folder holding
the tokenizer (engine/assets/): a router given a bare name would reach for a model hub.

`/server_info` also states, under SGLang's server_args names, the settings a harness reads to
tell what kind of deployment it is looking at (dsv4bench/servers/discovery.py): the PD transfer
backend, the overlap schedule, HiCache and its write policy, the parsers, the batch limits.
Each says what this engine does, not what SGLang's default would be.

`max_total_num_tokens`, the device KV pool in tokens (num_pages * page_size), sits at the top
level, where SGLang's answer has it: SGLang's /get_server_info spreads its scheduler's init
info into the answer (python/sglang/srt/entrypoints/http_server.py `get_server_info`,
python/sglang/srt/managers/scheduler.py `get_init_info`). A router has no pool and says none.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .. import __version__
from .config import EngineConfig
from .server_loop import EngineStats
from .tokenizer import DSV4Tokenizer


# The PD halves are processes of their own; the prefill sends each room's KV pages down a TCP
# connection to the decode (engine/pd/kv_wire.py), where SGLang uses mooncake or NIXL.
TRANSFER_BACKEND = "tcp"
# The host tier takes a copy of a page when it is evicted from the device, not when it is
# written (hiradix_cache.py): SGLang's "write_back".
HICACHE_WRITE_POLICY = "write_back"
REASONING_PARSER = "deepseek-v4"  # the frontend reads DSV4's thinking, as SGLang's parser of that name


def sglang_settings(cfg: EngineConfig, engine_type: str) -> dict[str, Any]:
    """The engine's settings under SGLang's server_args names, as this engine has them."""
    pd_mode = engine_type if engine_type in ("prefill", "decode") else "null"
    settings: dict[str, Any] = {
        "disaggregation_mode": pd_mode,
        # NOTE: one loop does schedule, run, postprocess in turn: the schedule never overlaps a step.
        "disable_overlap_schedule": True,
        "enable_hierarchical_cache": cfg.hicache,
        "hicache_write_policy": HICACHE_WRITE_POLICY,
        "hicache_ratio": (cfg.hicache_host_pages / cfg.num_pages) if cfg.hicache_host_pages else 2.0,
        "reasoning_parser": REASONING_PARSER,
        "chunked_prefill_size": cfg.chunked_prefill_tokens,
        "tp_size": 1,
        "dp_size": 1,  # one process, one rank
    }
    if pd_mode != "null":
        settings["disaggregation_transfer_backend"] = TRANSFER_BACKEND
    return settings


def server_info(
    cfg: EngineConfig, engine_type: str, model_name: str, tokenizer: DSV4Tokenizer, max_context: int
) -> dict[str, Any]:
    """The engine's settings and identity, under SGLang's field names where it has them
    (`tool_call_parser`, `max_running_requests` and `page_size` are EngineConfig's own)."""
    facts = dataclasses.asdict(cfg)
    model = facts.pop("model")
    facts["faults"] = sorted(fault.value for fault in cfg.faults)
    if engine_type != "router":
        facts["max_total_num_tokens"] = cfg.num_pages * cfg.page_size
    return {
        **facts,
        **sglang_settings(cfg, engine_type),
        "model_path": str(tokenizer.path.parent),
        "tokenizer_path": str(tokenizer.path.parent),
        "served_model_name": model_name,
        "context_length": max_context,
        "vocab_size": tokenizer.vocab_size,
        "engine_type": engine_type,
        "version": __version__,
        "model_config": model,
    }


def model_info(
    engine_type: str, model_name: str, tokenizer: DSV4Tokenizer, eos_token_id: int, max_context: int
) -> dict[str, Any]:
    pd_mode = engine_type if engine_type in ("prefill", "decode") else "null"
    return {
        "model_path": str(tokenizer.path.parent),
        "served_model_name": model_name,
        "tokenizer_path": str(tokenizer.path.parent),
        "is_generation": True,
        "model_type": "dsv4-mini",
        "architectures": ["DSV4Mini"],
        "eos_token_id": eos_token_id,
        "context_length": max_context,
        "disaggregation_mode": pd_mode,
        "tool_call_parser": "deepseekv4",
        "reasoning_parser": REASONING_PARSER,
    }


def load(stats: EngineStats) -> list[dict[str, Any]]:
    """`/get_load`: one entry per data-parallel rank (this engine has one), as SGLang answers it."""
    return [
        {
            "dp_rank": 0,
            "num_reqs": stats.num_running + stats.num_prefill,
            "num_waiting_reqs": stats.num_queued,
            "num_tokens": stats.pages_used,
        }
    ]
