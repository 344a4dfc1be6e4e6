"""Mamba-2 model configuration and named presets.

Field names follow the official state-spaces/mamba2-* `config.json` (top level) and mamba-ssm's
`Mamba2` constructor (the `ssm_cfg` block), so an official config maps onto this dataclass 1:1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from recurlen.models.config import ModelConfig, padded
from recurlen.models.mixer_model import mixer_model_json, read_mixer_model_json


@dataclass
class Mamba2Config(ModelConfig):
    d_model: int = 128
    """Width of the residual stream."""
    n_layer: int = 2
    """Number of Mamba-2 blocks."""
    vocab_size: int = 257
    """Tokenizer vocabulary; the embedding is padded up to `pad_vocab_size_multiple`."""
    pad_vocab_size_multiple: int = 8
    """Embedding rows are rounded up to a multiple of this (official models: 16 -> 50288)."""
    tie_embeddings: bool = True
    """LM head shares the embedding matrix (all official Mamba-2 checkpoints)."""
    d_state: int = 64
    """SSM state size N per head."""
    d_conv: int = 4
    """Width of the depthwise causal conv on xBC."""
    expand: int = 2
    """d_inner = expand * d_model."""
    headdim: int = 32
    """Head dimension P; nheads = d_inner / headdim."""
    ngroups: int = 1
    """Groups sharing B and C (like grouped-query attention)."""
    chunk_size: int = 256
    """SSD chunk length. Any positive value gives the same result; it only trades memory for speed."""
    A_init_range: tuple[float, float] = (1.0, 16.0)
    """A = -exp(A_log) is initialised uniformly in this range (mamba-ssm default (1, 16))."""
    A_init_log_uniform: bool = False
    """Sample A log-uniformly in A_init_range instead of uniformly (slow-decay heads need this)."""
    dt_min: float = 0.001
    """Initial dt is log-uniform in [dt_min, dt_max] (mamba-ssm default)."""
    dt_max: float = 0.1
    """Upper end of the initial dt range."""
    dt_init_floor: float = 1e-4
    """Smallest initial dt (mamba-ssm clamps the sampled values to it)."""
    dt_limit: tuple[float, float] = (0.0, float("inf"))
    """dt is clamped to this range after softplus (mamba-ssm default: no clamp)."""
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
        self.A_init_range = tuple(float(a) for a in self.A_init_range)  # omegaconf gives lists
        self.dt_limit = tuple(float(a) for a in self.dt_limit)
        self.check_positive_ints(("d_model", "n_layer", "vocab_size", "d_state", "d_conv", "expand", "headdim",
                                  "ngroups", "chunk_size", "pad_vocab_size_multiple"))
        if self.d_conv < 2:
            raise ValueError(f"model config: d_conv must be >= 2 (the conv carries d_conv-1 inputs); got {self.d_conv}")
        if self.d_inner % self.headdim != 0:
            raise ValueError(
                f"model config: d_inner = expand*d_model = {self.d_inner} must be divisible by headdim={self.headdim}"
            )
        if self.nheads % self.ngroups != 0 or self.d_inner % self.ngroups != 0:
            raise ValueError(
                f"model config: nheads={self.nheads} and d_inner={self.d_inner} must be divisible by "
                f"ngroups={self.ngroups}"
            )
        lo, hi = self.A_init_range
        if not 0 < lo <= hi:
            raise ValueError(f"model config: A_init_range must satisfy 0 < low <= high; got {self.A_init_range}")
        if not 0 < self.dt_min <= self.dt_max:
            raise ValueError(f"model config: need 0 < dt_min <= dt_max; got {self.dt_min}, {self.dt_max}")
        if not self.rms_norm:
            raise ValueError("model config: only rms_norm=True is supported (all official Mamba-2 checkpoints)")

    # ------------------------------------------------------------------ derived sizes
    @property
    def d_inner(self) -> int:
        return self.expand * self.d_model

    @property
    def nheads(self) -> int:
        return self.d_inner // self.headdim

    @property
    def conv_dim(self) -> int:
        return self.d_inner + 2 * self.ngroups * self.d_state

    @property
    def d_in_proj(self) -> int:
        return 2 * self.d_inner + 2 * self.ngroups * self.d_state + self.nheads

    @property
    def padded_vocab_size(self) -> int:
        return padded(self.vocab_size, self.pad_vocab_size_multiple)

    def describe(self) -> str:
        return (f"Mamba-2 (d_model {self.d_model}, {self.n_layer} layers, d_state {self.d_state}, headdim "
                f"{self.headdim})")

    @staticmethod
    def recognises(raw: dict[str, Any]) -> bool:
        """True for a state-spaces/mamba2-* config.json."""
        return "d_model" in raw and (raw.get("ssm_cfg") or {}).get("layer") == "Mamba2"

    # ------------------------------------------------------------------ official config.json
    def to_official_json(self) -> dict[str, Any]:
        """The config.json layout of the state-spaces/mamba2-* checkpoints."""
        default = Mamba2Config()
        ssm_cfg: dict[str, Any] = {"layer": "Mamba2"}
        for name in ("d_state", "d_conv", "expand", "headdim", "ngroups", "chunk_size", "dt_min", "dt_max",
                     "dt_init_floor", "conv_bias", "bias"):
            ssm_cfg[name] = getattr(self, name)
        ssm_cfg["A_init_range"] = list(self.A_init_range)
        if self.dt_limit != default.dt_limit:
            ssm_cfg["dt_limit"] = list(self.dt_limit)
        return mixer_model_json(self, ssm_cfg, hybrid_keys=True)

    @classmethod
    def from_official_json(cls, cfg: dict[str, Any], *, source: str = "config.json") -> Mamba2Config:
        supported_ssm = {"d_state", "d_conv", "expand", "headdim", "ngroups", "chunk_size", "A_init_range", "dt_min",
                         "dt_max", "dt_init_floor", "dt_limit", "conv_bias", "bias"}
        ignored = {"conv_init", "use_mem_eff_path"}
        refused = {"rmsnorm": True, "norm_before_gate": False, "D_has_hdim": False, "d_ssm": None,
                   "learnable_init_states": False, "activation": "silu"}
        return cls(**read_mixer_model_json(cfg, source=source, layer="Mamba2",
                                           wrong_layer="recurlen supports only 'Mamba2'", supported_ssm=supported_ssm,
                                           ignored_ssm=ignored, refused_ssm=refused))


# Official checkpoint shapes (state-spaces/mamba2-*): GPT-NeoX-20B tokenizer, 50277 -> 50288.
_OFFICIAL = dict(vocab_size=50277, pad_vocab_size_multiple=16, d_state=128, headdim=64, expand=2, ngroups=1,
                 chunk_size=256)

PRESETS: dict[str, dict[str, Any]] = {
    # Small CPU presets (byte-level vocabulary of the embedded corpus).
    "nano": dict(d_model=64, n_layer=2, d_state=16, headdim=16, chunk_size=64),
    "tiny": dict(d_model=128, n_layer=2, d_state=64, headdim=32, chunk_size=64),
    "small": dict(d_model=256, n_layer=4, d_state=64, headdim=32, chunk_size=64),
    # Official state-spaces/mamba2-* shapes.
    "130m": dict(d_model=768, n_layer=24, **_OFFICIAL),
    "370m": dict(d_model=1024, n_layer=48, **_OFFICIAL),
    "780m": dict(d_model=1536, n_layer=48, **_OFFICIAL),
    "1.3b": dict(d_model=2048, n_layer=48, **_OFFICIAL),
    "2.7b": dict(d_model=2560, n_layer=64, **_OFFICIAL),
}

def preset(name: str, **overrides: Any) -> Mamba2Config:
    """A named model shape, optionally with fields overridden."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; allowed: {sorted(PRESETS)}")
    return Mamba2Config(**{**PRESETS[name], **overrides})


__all__ = ["Mamba2Config", "PRESETS", "preset"]
