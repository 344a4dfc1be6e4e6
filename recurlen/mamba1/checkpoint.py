"""Mamba-1 official-format checkpoints: config.json + pytorch_model.bin (state-spaces/mamba-*).

The layout is Mamba-2's (same directory, same top-level config, fp16 weights, the tied head stored
or left out); only `ssm_cfg` differs (no `layer` key). Loading is strict: missing, unexpected or
mis-shaped keys name themselves in the error.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from recurlen.checkpoint import (
    CONFIG_NAME,
    RECURLEN_CONFIG_NAME,
    WEIGHTS_NAME,
    load_official_state_dict,
    read_state_dict,
    resolve_pretrained_dir,
)
from recurlen.files import atomic_write
from recurlen.mamba1.config import Mamba1Config
from recurlen.mamba1.model import Mamba1LM


def read_config(directory: Path) -> Mamba1Config:
    own = directory / RECURLEN_CONFIG_NAME
    if own.is_file():
        return Mamba1Config.from_dict(json.loads(own.read_text()))
    config_path = directory / CONFIG_NAME
    if not config_path.is_file():
        raise FileNotFoundError(f"{directory} has no {CONFIG_NAME}")
    try:
        raw = json.loads(config_path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{config_path} is not valid JSON: {err}") from err
    return Mamba1Config.from_official_json(raw, source=str(config_path))


def load_pretrained(path_or_hub_id: str, *, backend: str = "auto", device=None,
                    dtype: torch.dtype = torch.float32) -> Mamba1LM:
    directory = resolve_pretrained_dir(path_or_hub_id)
    model = Mamba1LM(read_config(directory), backend=backend)
    load_official_state_dict(model, read_state_dict(directory), source=str(directory))
    return model.to(device=device, dtype=dtype)


def save_pretrained(model: Mamba1LM, directory: str, *, dtype: torch.dtype = torch.float32) -> None:
    """Official layout; float32 by default so that a round trip is exact (pass float16 to match the hub)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    official = json.dumps(model.config.to_official_json(), indent=2)
    own = json.dumps(model.config.to_dict(), indent=2)
    atomic_write(out / CONFIG_NAME, lambda p: p.write_text(official))
    atomic_write(out / RECURLEN_CONFIG_NAME, lambda p: p.write_text(own))
    state = {k: v.detach().to("cpu", dtype).clone() for k, v in model.state_dict().items()}
    atomic_write(out / WEIGHTS_NAME, lambda p: torch.save(state, p))


__all__ = ["load_pretrained", "read_config", "save_pretrained"]
