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
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn as nn

from recurlen.models.config import ModelConfig, padded
from recurlen.models.layers import ResidualBlock, RMSNorm
from recurlen.models.lm import StatefulLM
from recurlen.models.official import WEIGHTS_NAME, OfficialFormat
from recurlen.models.transformers_format import Field, TransformersFormat

# mamba-ssm's from_pretrained reads pytorch_model.bin and nothing else: the format's own file.
MIXER_MODEL_FORMAT = OfficialFormat(
    weights=WEIGHTS_NAME, embedding_key="backbone.embedding.weight", tie_flag="tie_embeddings", library="mamba-ssm",
    loading="from mamba_ssm.models.mixer_seq_simple import MambaLMHeadModel; "
            "model = MambaLMHeadModel.from_pretrained(DIR)")


@dataclass
class MixerModelConfig(ModelConfig):
    """The fields every mamba-ssm language model has, whatever its mixer: config.json's top level and the ssm_cfg
    keys Mamba-1 and Mamba-2 share. An architecture's config adds its mixer's fields (and may change defaults)."""

    d_model: int = 128
    """Width of the residual stream."""
    n_layer: int = 2
    """Number of blocks."""
    vocab_size: int = 257
    """Tokenizer vocabulary; the embedding is padded up to `pad_vocab_size_multiple`."""
    pad_vocab_size_multiple: int = 8
    """Embedding rows are rounded up to a multiple of this (official Mamba-2: 16 -> 50288, Mamba-1: 8 -> 50280)."""
    tie_embeddings: bool = True
    """LM head shares the embedding matrix (all official checkpoints)."""
    d_state: int = 16
    """SSM state size N."""
    d_conv: int = 4
    """Width of the depthwise causal conv before the scan."""
    expand: int = 2
    """d_inner = expand * d_model."""
    dt_min: float = 0.001
    """Initial dt is log-uniform in [dt_min, dt_max] (mamba-ssm default)."""
    dt_max: float = 0.1
    """Upper end of the initial dt range."""
    dt_init_floor: float = 1e-4
    """Smallest initial dt (mamba-ssm clamps the sampled values to it)."""
    conv_bias: bool = True
    """Bias in the short causal convolution."""
    bias: bool = False
    """Bias in in_proj / out_proj (official: False)."""
    norm_eps: float = 1e-5
    """Epsilon of the RMSNorms."""
    rms_norm: bool = True
    """RMSNorm (the only norm implemented; False is rejected)."""
    residual_in_fp32: bool = True
    """Keep the residual stream in float32 under mixed precision."""
    initializer_range: float = 0.02
    """Std of the embedding init when training from scratch."""

    def __post_init__(self) -> None:
        self.check_positive_ints(("d_model", "n_layer", "vocab_size", "d_state", "d_conv", "expand",
                                  "pad_vocab_size_multiple"))
        if self.d_conv < 2:
            raise ValueError(f"model config: d_conv must be >= 2 (the conv carries d_conv-1 inputs); got {self.d_conv}")
        if not 0 < self.dt_min <= self.dt_max:
            raise ValueError(f"model config: need 0 < dt_min <= dt_max; got {self.dt_min}, {self.dt_max}")
        if not self.rms_norm:
            raise ValueError("model config: only rms_norm=True is supported (all official checkpoints)")

    @property
    def d_inner(self) -> int:
        return self.expand * self.d_model

    @property
    def padded_vocab_size(self) -> int:
        return padded(self.vocab_size, self.pad_vocab_size_multiple)


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

    @torch.no_grad()
    def state_decays(self) -> dict[str, torch.Tensor]:
        """The mixers' `decay_rates()` (each layer's, shaped as its recurrent state without the lanes), stacked."""
        rates = [block.mixer.decay_rates() for block in self.backbone.layers]
        return {self.state_cls.RECURRENT[0]: torch.stack(rates).float().cpu()}


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


# ---------------------------------------------------------------------- transformers' format
def mixer_model_transformers_format(*, model_type: str, class_name: str,
                                    fields: tuple[Field, ...]) -> TransformersFormat:
    """transformers' format of a mamba-ssm language model (MambaConfig, Mamba2Config): the parameters are
    mamba-ssm's but for the embedding's name (`backbone.embeddings`), the fields below have the same names and
    defaults in both configs, and `fields` are the architecture's (those whose names or defaults differ)."""
    shared = (Field("expand", "expand", 2), Field("conv_kernel", "d_conv", 4), Field("use_bias", "bias", False),
              Field("use_conv_bias", "conv_bias", True), Field("residual_in_fp32", "residual_in_fp32", True),
              Field("layer_norm_epsilon", "norm_eps", 1e-5), Field("time_step_min", "dt_min", 0.001),
              Field("time_step_max", "dt_max", 0.1), Field("time_step_floor", "dt_init_floor", 1e-4))
    return TransformersFormat(model_type=model_type, class_name=class_name, fields=(*fields, *shared),
                              keys=(("backbone.embedding.", "backbone.embeddings."),),
                              read_constants={"pad_vocab_size_multiple": 1},  # its embedding rows are the vocabulary
                              fixed={"hidden_act": "silu"})


__all__ = ["MIXER_MODEL_FORMAT", "MixerModelConfig", "MixerModelLM", "mixer_model_json",
           "mixer_model_transformers_format", "read_mixer_model_json"]
