"""Mamba-2 model configuration.

Field names follow the official state-spaces/mamba2-* `config.json` (top level) and mamba-ssm's
`Mamba2` constructor (the `ssm_cfg` block), so an official config maps onto this dataclass 1:1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from recurlen.models.mixer_model import MixerModelConfig, mixer_model_json, read_mixer_model_json


@dataclass
class Mamba2Config(MixerModelConfig):
    """The shared fields are MixerModelConfig's (recurlen.models.mixer_model); these are the Mamba2 mixer's."""

    d_state: int = 64
    """SSM state size N per head."""
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
    dt_limit: tuple[float, float] = (0.0, float("inf"))
    """dt is clamped to this range after softplus (mamba-ssm default: no clamp)."""

    def __post_init__(self) -> None:
        self.A_init_range = tuple(float(a) for a in self.A_init_range)  # omegaconf gives lists
        self.dt_limit = tuple(float(a) for a in self.dt_limit)
        self.check_positive_ints(("headdim", "ngroups", "chunk_size"))
        super().__post_init__()
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

    # ------------------------------------------------------------------ derived sizes
    @property
    def nheads(self) -> int:
        return self.d_inner // self.headdim

    @property
    def conv_dim(self) -> int:
        return self.d_inner + 2 * self.ngroups * self.d_state

    @property
    def d_in_proj(self) -> int:
        return 2 * self.d_inner + 2 * self.ngroups * self.d_state + self.nheads

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


__all__ = ["Mamba2Config"]
