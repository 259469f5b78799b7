"""What every server of the bundled engine (unified, PD router, prefill, decode) says about
itself on SGLang's informational endpoints: `/server_info` and `/model_info` (with the older
`/get_server_info` and `/get_model_info` aliases) and `/get_load`.

SGLang's router reads these when it registers a worker: the model id, the disaggregation mode,
and the tokenizer, which it loads from `model_path`. So `model_path` is the local folder holding
the tokenizer (engine/assets/): a router given a bare name would reach for a model hub.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .. import __version__
from .config import EngineConfig
from .server_loop import EngineStats
from .tokenizer import DSV4Tokenizer


def server_info(cfg: EngineConfig, engine_type: str, model_name: str, tokenizer: DSV4Tokenizer,
                max_context: int) -> dict[str, Any]:
    """The engine's settings and identity, under SGLang's field names where it has them."""
    facts = dataclasses.asdict(cfg)
    model = facts.pop("model")
    facts["faults"] = sorted(fault.value for fault in cfg.faults)
    pd_mode = engine_type if engine_type in ("prefill", "decode") else "null"
    return {**facts, "model_path": str(tokenizer.path.parent), "tokenizer_path": str(tokenizer.path.parent),
            "served_model_name": model_name, "context_length": max_context, "vocab_size": tokenizer.vocab_size,
            "engine_type": engine_type, "disaggregation_mode": pd_mode, "version": __version__, "model_config": model}


def model_info(engine_type: str, model_name: str, tokenizer: DSV4Tokenizer, eos_token_id: int,
               max_context: int) -> dict[str, Any]:
    pd_mode = engine_type if engine_type in ("prefill", "decode") else "null"
    return {"model_path": str(tokenizer.path.parent), "served_model_name": model_name,
            "tokenizer_path": str(tokenizer.path.parent), "is_generation": True, "model_type": "dsv4-mini",
            "architectures": ["DSV4Mini"], "eos_token_id": eos_token_id, "context_length": max_context,
            "disaggregation_mode": pd_mode, "tool_call_parser": "deepseekv4", "reasoning_parser": "deepseek-v4"}


def load(stats: EngineStats) -> list[dict[str, Any]]:
    """`/get_load`: one entry per data-parallel rank (this engine has one), as SGLang answers it."""
    return [{"dp_rank": 0, "num_reqs": stats.num_running + stats.num_prefill, "num_waiting_reqs": stats.num_queued,
             "num_tokens": stats.pages_used}]
