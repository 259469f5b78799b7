"""DSV4-mini weights on disk: safetensors, with the model config in the metadata so a file
that does not fit the config is refused with a clear message instead of a shape error."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from .config import ModelConfig
from .model.model import DSV4Mini

DEFAULT_WEIGHTS = Path(__file__).resolve().parent / "assets" / "dsv4-mini.safetensors"


class WeightsError(Exception):
    """The weights cannot be used; one line for the user."""


def save_weights(
    model: DSV4Mini, path: Path, info: dict[str, Any] | None = None, dtype: torch.dtype = torch.bfloat16
) -> None:
    """Write the model's state (in `dtype`, bf16 by default to keep the file small)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {
        k: v.detach().to("cpu", dtype if v.is_floating_point() else v.dtype).contiguous()
        for k, v in model.state_dict().items()
    }
    meta = {"model_config": json.dumps(dataclasses.asdict(model.cfg)), "info": json.dumps(info or {})}
    save_file(state, str(path), metadata=meta)


def read_config(path: Path) -> ModelConfig:
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
    except (OSError, SafetensorError) as e:  # missing, or not a safetensors file at all
        raise WeightsError(f"cannot read {path} as safetensors weights: {e}") from None
    if "model_config" not in meta:
        raise WeightsError(f"{path} has no model config in its metadata; it was not written by dsv4bench")
    return ModelConfig(**json.loads(meta["model_config"]))


def load_weights(cfg: ModelConfig, path: Path | None = None, device: str = "cpu") -> DSV4Mini:
    """A DSV4Mini with the weights at `path` (default: the shipped ones), in float32."""
    path = Path(path) if path else DEFAULT_WEIGHTS
    if not path.is_file():
        raise WeightsError(
            f"no weights at {path}: rebuild them with `dsv4bench engine train`, "
            "or serve untrained weights with --random-weights"
        )
    try:
        file_cfg = read_config(path)
    except (ValueError, TypeError) as e:  # metadata that is no config
        raise WeightsError(f"cannot read {path}: {e}") from None
    if file_cfg != cfg:
        diff = [
            f"{f.name} {getattr(file_cfg, f.name)} != {getattr(cfg, f.name)}"
            for f in dataclasses.fields(cfg)
            if getattr(file_cfg, f.name) != getattr(cfg, f.name)
        ]
        raise WeightsError(f"weights at {path} do not match the model config: {', '.join(diff)}")
    model = DSV4Mini(cfg)
    state = {}
    with safe_open(str(path), framework="pt", device="cpu") as f:
        for k in f.keys():
            t = f.get_tensor(k)
            state[k] = t.float() if t.is_floating_point() else t
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise WeightsError(
            f"weights at {path} do not fit the model: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    return model.to(device)
