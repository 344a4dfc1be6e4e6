"""Mamba-1 model configuration.

Field names follow the official state-spaces/mamba-* `config.json` (top level) and mamba-ssm's
`Mamba` constructor (the `ssm_cfg` block, which for Mamba-1 has no `layer` key or `layer: Mamba1`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from recurlen.models.mixer_model import MixerModelConfig, mixer_model_json, read_mixer_model_json


@dataclass
class Mamba1Config(MixerModelConfig):
    """The shared fields are MixerModelConfig's (recurlen.models.mixer_model); these are the Mamba mixer's."""

    dt_rank: int | str = "auto"
    """Rank of the dt projection; 'auto' = ceil(d_model / 16) (mamba-ssm default)."""
    chunk_size: int = 32
    """Time steps per chunk of the CPU scan. Any positive value gives the same result; it trades cache for calls."""
    A_init_range: tuple[float, float] | None = None
    """None: mamba-ssm's S4D-real initialisation, A[:, n] = -(n + 1) for every channel. A range: every
    (channel, state) entry of A is sampled in it instead (slowly decaying memories need small values)."""
    A_init_log_uniform: bool = False
    """With A_init_range: sample log-uniformly instead of uniformly."""
    dt_scale: float = 1.0
    """dt_proj.weight is initialised uniformly in +- dt_scale / sqrt(dt_rank)."""

    def __post_init__(self) -> None:
        if self.A_init_range is not None:
            self.A_init_range = tuple(float(a) for a in self.A_init_range)  # omegaconf gives lists
            if len(self.A_init_range) != 2 or not 0 < self.A_init_range[0] <= self.A_init_range[1]:
                raise ValueError("model config: A_init_range must be null (S4D-real) or [low, high] with "
                                 f"0 < low <= high; got {self.A_init_range}")
        if self.dt_rank == "auto":
            self.dt_rank = math.ceil(self.d_model / 16)
        self.check_positive_ints(("dt_rank", "chunk_size"))
        super().__post_init__()

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


__all__ = ["Mamba1Config"]
