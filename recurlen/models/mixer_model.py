"""mamba-ssm's language-model layout, shared by every architecture that reuses it (Mamba-1 and Mamba-2):

    backbone.embedding.weight          (V_pad, D)
    backbone.layers.{i}.norm.weight    (D,)           pre-norm of block i (ResidualBlock)
    backbone.layers.{i}.mixer.*        the architecture's mixer
    backbone.norm_f.weight             (D,)
    lm_head.weight                     (V_pad, D), tied to the embedding

and its config.json (d_model, n_layer, vocab_size, ssm_cfg, ...). An architecture in this layout provides its
mixer class and the ssm_cfg keys it reads; the LM, its initialisation and the config's top level are here.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
import torch.nn as nn

from recurlen.models.layers import ResidualBlock, RMSNorm
from recurlen.models.lm import StatefulLM
from recurlen.models.official import WEIGHTS_NAME, OfficialFormat

MIXER_MODEL_FORMAT = OfficialFormat(weights=WEIGHTS_NAME, embedding_key="backbone.embedding.weight",
                                    tie_flag="tie_embeddings")


class Backbone(nn.Module):
    def __init__(self, cfg: Any, mixer_cls: type[nn.Module]) -> None:
        super().__init__()
        self.embedding = nn.Embedding(cfg.padded_vocab_size, cfg.d_model)
        self.layers = nn.ModuleList([
            ResidualBlock(cfg.d_model, mixer_cls(cfg), eps=cfg.norm_eps, residual_in_fp32=cfg.residual_in_fp32)
            for _ in range(cfg.n_layer)])
        self.norm_f = RMSNorm(cfg.d_model, eps=cfg.norm_eps)


class MixerModelLM(StatefulLM):
    """embedding -> ResidualBlock(mixer) x n_layer -> norm_f -> (tied) LM head, with state in and out."""

    mixer_cls: ClassVar[type[nn.Module]]
    official = MIXER_MODEL_FORMAT

    def __init__(self, config: Any, *, backend: str = "auto") -> None:
        super().__init__(config, backend=backend)
        self.backbone = Backbone(config, self.mixer_cls)
        self.lm_head = nn.Linear(config.d_model, config.padded_vocab_size, bias=False)
        self._init_weights()
        if config.tie_embeddings:
            self.lm_head.weight = self.backbone.embedding.weight

    @torch.no_grad()
    def _init_weights(self) -> None:
        """mamba-ssm's from-scratch init: N(0, 0.02) embedding, zero in/out biases, out_proj scaled by 1/sqrt(K)."""
        cfg = self.config
        nn.init.normal_(self.backbone.embedding.weight, std=cfg.initializer_range)
        for block in self.backbone.layers:
            mixer = block.mixer
            for lin in (mixer.in_proj, mixer.out_proj):
                if lin.bias is not None:
                    nn.init.zeros_(lin.bias)
            nn.init.kaiming_uniform_(mixer.out_proj.weight, a=math.sqrt(5))
            mixer.out_proj.weight /= math.sqrt(cfg.n_layer)

    @property
    def embedding(self) -> nn.Embedding:
        return self.backbone.embedding

    @property
    def layers(self) -> nn.ModuleList:
        return self.backbone.layers

    def start(self, hidden: torch.Tensor):
        return hidden, None  # (hidden, residual): the residual add opens each block

    def finish(self, carry) -> torch.Tensor:
        return self.backbone.norm_f(self.backbone.layers[-1].close(*carry))


# ---------------------------------------------------------------------- config.json
def mixer_model_json(cfg: Any, ssm_cfg: dict[str, Any], *, hybrid_keys: bool) -> dict[str, Any]:
    """The config.json of a mamba-ssm language model (top level + the mixer's ssm_cfg). hybrid_keys: also the keys
    of mamba-ssm 2's MambaConfig (no MLP, no attention layers), as the state-spaces/mamba2-* files have them."""
    top: dict[str, Any] = {"d_model": cfg.d_model}
    if hybrid_keys:
        top["d_intermediate"] = 0
    top.update(n_layer=cfg.n_layer, vocab_size=cfg.vocab_size, ssm_cfg=ssm_cfg)
    if hybrid_keys:
        top.update(attn_layer_idx=[], attn_cfg={})
    return {**top, "rms_norm": cfg.rms_norm, "residual_in_fp32": cfg.residual_in_fp32, "fused_add_norm": True,
            "pad_vocab_size_multiple": cfg.pad_vocab_size_multiple, "tie_embeddings": cfg.tie_embeddings}


def read_mixer_model_json(cfg: dict[str, Any], *, source: str, layer: str, wrong_layer: str,
                          supported_ssm: set[str], ignored_ssm: set[str] = frozenset(),
                          refused_ssm: dict[str, Any] | None = None) -> dict[str, Any]:
    """Config fields from a mamba-ssm config.json whose mixer is `layer`; what recurlen cannot run is refused
    with the key named (hybrid attention, MLP blocks, another mixer, unknown or unsupported ssm_cfg keys)."""
    ssm_cfg = dict(cfg.get("ssm_cfg") or {})
    found = ssm_cfg.pop("layer", "Mamba1")  # mamba-ssm's default mixer
    if found != layer:
        raise ValueError(f"{source}: ssm_cfg.layer is {found!r}; {wrong_layer}")
    if cfg.get("attn_layer_idx"):
        raise ValueError(f"{source}: hybrid attention layers (attn_layer_idx={cfg['attn_layer_idx']}) "
                         "are not supported")
    if cfg.get("d_intermediate", 0):
        raise ValueError(f"{source}: d_intermediate={cfg['d_intermediate']} (MLP blocks) is not supported; need 0")
    for name in ("d_model", "n_layer", "vocab_size"):
        if name not in cfg:
            raise ValueError(f"{source}: missing required key {name!r}")
    for key, want in (refused_ssm or {}).items():
        if key in ssm_cfg and ssm_cfg[key] != want:
            raise ValueError(f"{source}: ssm_cfg.{key}={ssm_cfg[key]!r} is not supported (need {want!r})")
    unknown = sorted(set(ssm_cfg) - supported_ssm - ignored_ssm - set(refused_ssm or {}))
    if unknown:
        raise ValueError(f"{source}: unknown ssm_cfg keys {unknown}; supported: {sorted(supported_ssm)}")
    return dict(
        d_model=cfg["d_model"], n_layer=cfg["n_layer"], vocab_size=cfg["vocab_size"],
        pad_vocab_size_multiple=cfg.get("pad_vocab_size_multiple", 8), tie_embeddings=cfg.get("tie_embeddings", True),
        rms_norm=cfg.get("rms_norm", True), residual_in_fp32=cfg.get("residual_in_fp32", True),
        **{k: v for k, v in ssm_cfg.items() if k in supported_ssm})


__all__ = ["MIXER_MODEL_FORMAT", "MixerModelLM", "mixer_model_json", "read_mixer_model_json"]
