"""Mamba-1's entry in the architecture registry (recurlen.arch)."""

from __future__ import annotations

from recurlen.arch import Architecture
from recurlen.checkpoint import load_official_state_dict, read_state_dict
from recurlen.mamba1.checkpoint import read_config
from recurlen.mamba1.config import PRESETS, Mamba1Config
from recurlen.mamba1.model import Mamba1LM
from recurlen.mamba1.state import Mamba1State


def recognises(raw: dict) -> bool:
    """state-spaces/mamba-*: the Mamba layout (d_model, ssm_cfg) without a Mamba2 layer."""
    return "d_model" in raw and (raw.get("ssm_cfg") or {}).get("layer", "Mamba1") == "Mamba1"


def describe(cfg: Mamba1Config) -> str:
    return f"Mamba-1 (d_model {cfg.d_model}, {cfg.n_layer} layers, d_state {cfg.d_state}, d_inner {cfg.d_inner})"


ARCHITECTURE = Architecture(
    name="mamba1", title="Mamba-1", prefix="mamba1-", config_cls=Mamba1Config, model_cls=Mamba1LM,
    state_cls=Mamba1State, presets=PRESETS, recognises=recognises, read_config=read_config,
    load_state_dict=lambda model, sd, source: load_official_state_dict(model, sd, source=source),
    read_state_dict=read_state_dict, describe=describe, official_marker="state-spaces/mamba-")
