"""Mamba-2's entry in the architecture registry (recurlen.arch); its modules are config, state, ssd,
kernels, model and checkpoint at the package's top level."""

from __future__ import annotations

from recurlen.arch import Architecture
from recurlen.checkpoint import load_official_state_dict, read_config, read_state_dict
from recurlen.config import PRESETS, Mamba2Config
from recurlen.model import Mamba2LM
from recurlen.state import RecurrentState


def recognises(raw: dict) -> bool:
    return "d_model" in raw and (raw.get("ssm_cfg") or {}).get("layer") == "Mamba2"


def describe(cfg: Mamba2Config) -> str:
    return (f"Mamba-2 (d_model {cfg.d_model}, {cfg.n_layer} layers, d_state {cfg.d_state}, headdim "
            f"{cfg.headdim})")


ARCHITECTURE = Architecture(
    name="mamba2", title="Mamba-2", prefix="", config_cls=Mamba2Config, model_cls=Mamba2LM, state_cls=RecurrentState,
    presets=PRESETS, recognises=recognises, read_config=read_config,
    load_state_dict=lambda model, sd, source: load_official_state_dict(model, sd, source=source),
    read_state_dict=read_state_dict, describe=describe, official_marker="mamba2-")
