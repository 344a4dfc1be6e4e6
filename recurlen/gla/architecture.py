"""GLA's entry in the architecture registry (recurlen.arch)."""

from __future__ import annotations

from recurlen.arch import Architecture
from recurlen.gla.checkpoint import load_state_dict_strict, read_config, read_state_dict
from recurlen.gla.config import PRESETS, GLAConfig
from recurlen.gla.model import GLALM
from recurlen.gla.state import GLAState


def recognises(raw: dict) -> bool:
    return raw.get("model_type") == "gla"


def describe(cfg: GLAConfig) -> str:
    return (f"GLA (hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers, {cfg.num_heads} heads of "
            f"{cfg.head_k_dim} x {cfg.head_v_dim}{', short convs' if cfg.use_short_conv else ''})")


ARCHITECTURE = Architecture(
    name="gla", title="GLA", prefix="gla-", config_cls=GLAConfig, model_cls=GLALM, state_cls=GLAState, presets=PRESETS,
    recognises=recognises, read_config=read_config,
    load_state_dict=lambda model, sd, source: load_state_dict_strict(model, sd, source=source),
    read_state_dict=read_state_dict, describe=describe, official_marker="gla-")
