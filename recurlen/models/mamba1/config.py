"""Mamba-1 model configuration and named presets.

Field names follow the official state-spaces/mamba-* `config.json` (top level) and mamba-ssm's
`Mamba` constructor (the `ssm_cfg` block, which for Mamba-1 has no `layer` key or `layer: Mamba1`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from recurlen.models.config import ModelConfig, padded
from recurlen.models.mixer_model import mixer_model_json, read_mixer_model_json


@dataclass
class Mamba1Config(ModelConfig):
    d_model: int = 128
    """Width of the residual stream."""
    n_layer: int = 2
    """Number of Mamba-1 blocks."""
    vocab_size: int = 257
    """Tokenizer vocabulary; the embedding is padded up to `pad_vocab_size_multiple`."""
    pad_vocab_size_multiple: int = 8
    """Embedding rows are rounded up to a multiple of this (official models: 8 -> 50280)."""
    tie_embeddings: bool = True
    """LM head shares the embedding matrix (all official Mamba-1 checkpoints)."""
    d_state: int = 16
    """SSM state size N per channel."""
    d_conv: int = 4
    """Width of the depthwise causal conv on x."""
    expand: int = 2
    """d_inner = expand * d_model."""
    dt_rank: int | str = "auto"
    """Rank of the dt projection; 'auto' = ceil(d_model / 16) (mamba-ssm default)."""
    chunk_size: int = 32
    """Time steps per chunk of the CPU scan. Any positive value gives the same result; it trades cache for calls."""
    A_init_range: tuple[float, float] | None = None
    """None: mamba-ssm's S4D-real initialisation, A[:, n] = -(n + 1) for every channel. A range: every
    (channel, state) entry of A is sampled in it instead (slowly decaying memories need small values)."""
    A_init_log_uniform: bool = False
    """With A_init_range: sample log-uniformly instead of uniformly."""
    dt_min: float = 0.001
    """Initial dt is log-uniform in [dt_min, dt_max] (mamba-ssm default)."""
    dt_max: float = 0.1
    dt_init_floor: float = 1e-4
    dt_scale: float = 1.0
    """dt_proj.weight is initialised uniformly in +- dt_scale / sqrt(dt_rank)."""
    conv_bias: bool = True
    bias: bool = False
    """Bias in in_proj / out_proj (official: False)."""
    norm_eps: float = 1e-5
    rms_norm: bool = True
    residual_in_fp32: bool = True
    initializer_range: float = 0.02
    """Std of the embedding init when training from scratch."""

    def __post_init__(self) -> None:
        if self.A_init_range is not None:
            self.A_init_range = tuple(float(a) for a in self.A_init_range)  # omegaconf gives lists
            if len(self.A_init_range) != 2 or not 0 < self.A_init_range[0] <= self.A_init_range[1]:
                raise ValueError("model config: A_init_range must be null (S4D-real) or [low, high] with "
                                 f"0 < low <= high; got {self.A_init_range}")
        if self.dt_rank == "auto":
            self.dt_rank = math.ceil(self.d_model / 16)
        self.check_positive_ints(("d_model", "n_layer", "vocab_size", "d_state", "d_conv", "expand", "dt_rank",
                                  "chunk_size", "pad_vocab_size_multiple"))
        if self.d_conv < 2:
            raise ValueError(f"model config: d_conv must be >= 2 (the conv carries d_conv-1 inputs); got {self.d_conv}")
        if not 0 < self.dt_min <= self.dt_max:
            raise ValueError(f"model config: need 0 < dt_min <= dt_max; got {self.dt_min}, {self.dt_max}")
        if not self.rms_norm:
            raise ValueError("model config: only rms_norm=True is supported (all official Mamba-1 checkpoints)")

    @property
    def d_inner(self) -> int:
        return self.expand * self.d_model

    @property
    def padded_vocab_size(self) -> int:
        return padded(self.vocab_size, self.pad_vocab_size_multiple)

    def describe(self) -> str:
        return (f"Mamba-1 (d_model {self.d_model}, {self.n_layer} layers, d_state {self.d_state}, "
                f"d_inner {self.d_inner})")

    @staticmethod
    def recognises(raw: dict[str, Any]) -> bool:
        """state-spaces/mamba-*: the Mamba layout (d_model, ssm_cfg) without a Mamba2 layer."""
        return "d_model" in raw and (raw.get("ssm_cfg") or {}).get("layer", "Mamba1") == "Mamba1"

    # ------------------------------------------------------------------ official config.json
    def to_official_json(self) -> dict[str, Any]:
        """The config.json layout of the state-spaces/mamba-* checkpoints (no `layer`: Mamba-1)."""
        ssm_cfg = {name: getattr(self, name) for name in ("d_state", "d_conv", "expand", "dt_rank", "dt_min",
                                                          "dt_max", "dt_init_floor", "dt_scale", "conv_bias", "bias")}
        return mixer_model_json(self, ssm_cfg, hybrid_keys=False)

    @classmethod
    def from_official_json(cls, cfg: dict[str, Any], *, source: str = "config.json") -> Mamba1Config:
        dt_init = (cfg.get("ssm_cfg") or {}).get("dt_init", "random")
        if dt_init not in ("random", "constant"):
            raise ValueError(f"{source}: ssm_cfg.dt_init={dt_init!r}; allowed 'random', 'constant'")
        supported_ssm = {"d_state", "d_conv", "expand", "dt_rank", "dt_min", "dt_max", "dt_init_floor", "dt_scale",
                         "conv_bias", "bias"}
        return cls(**read_mixer_model_json(
            cfg, source=source, layer="Mamba1", wrong_layer="a Mamba-1 checkpoint has no layer key or 'Mamba1'",
            supported_ssm=supported_ssm, ignored_ssm={"dt_init", "use_fast_path"}))


# Official checkpoint shapes (state-spaces/mamba-*): GPT-NeoX-20B tokenizer, 50277 -> 50280.
_OFFICIAL = dict(vocab_size=50277, pad_vocab_size_multiple=8, d_state=16, expand=2)

PRESETS: dict[str, dict[str, Any]] = {
    # Small CPU presets (byte-level vocabulary of the embedded corpus).
    "nano": dict(d_model=64, n_layer=2, d_state=8),
    "tiny": dict(d_model=128, n_layer=2, d_state=16),
    # Official state-spaces/mamba-* shapes.
    "130m": dict(d_model=768, n_layer=24, **_OFFICIAL),
    "370m": dict(d_model=1024, n_layer=48, **_OFFICIAL),
    "790m": dict(d_model=1536, n_layer=48, **_OFFICIAL),
    "1.4b": dict(d_model=2048, n_layer=48, **_OFFICIAL),
    "2.8b": dict(d_model=2560, n_layer=64, **_OFFICIAL),
}


def preset(name: str, **overrides: Any) -> Mamba1Config:
    """A named Mamba-1 shape, optionally with fields overridden."""
    if name not in PRESETS:
        raise ValueError(f"unknown Mamba-1 preset {name!r}; allowed: {sorted(PRESETS)}")
    return Mamba1Config(**{**PRESETS[name], **overrides})


__all__ = ["PRESETS", "Mamba1Config", "preset"]
