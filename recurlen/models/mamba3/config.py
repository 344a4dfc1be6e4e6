"""Mamba-3 model configuration (SISO).

The mixer's field names are those of mamba-ssm's `Mamba3` constructor (mamba_ssm/modules/mamba3.py), and the
top level is mamba-ssm's language-model config.json (d_model, n_layer, vocab_size, ssm_cfg with layer "Mamba3"),
so a config maps onto this dataclass 1:1. Mamba-3 has no short convolution, so the conv fields Mamba-1 and
Mamba-2 share (recurlen.models.mixer_model.MixerModelConfig) are not here; the language model's fields are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from recurlen.models import config
from recurlen.models.config import ModelConfig, padded
from recurlen.models.mixer_model import mixer_model_json, read_mixer_model_json

LAYER = "Mamba3"
MIXER_NORM_EPS = 1e-5
"""mamba-ssm's Mamba3 fixes the eps of its B / C norms and of its output norm at 1e-5 (not a constructor field)."""


@dataclass
class Mamba3Config(ModelConfig):
    d_model: int = 128
    """Width of the residual stream."""
    n_layer: int = 2
    """Number of blocks."""
    vocab_size: int = 257
    """Tokenizer vocabulary; the embedding is padded up to `pad_vocab_size_multiple`."""
    pad_vocab_size_multiple: int = 8
    """Embedding rows are rounded up to a multiple of this."""
    tie_embeddings: bool = True
    """LM head shares the embedding matrix."""
    d_state: int = 128
    """SSM state size N per head (the key / query dim of the kernel: a power of two for mamba-ssm's kernel)."""
    expand: int = 2
    """d_inner = expand * d_model."""
    headdim: int = 64
    """Head dimension P (the value dim); nheads = d_inner / headdim."""
    ngroups: int = 1
    """Groups sharing B and C (mamba-ssm's num_bc_heads)."""
    rope_fraction: float = 0.5
    """Fraction of the d_state entries of B and C rotated by the cumulative angle (0.5 or 1.0, as mamba-ssm)."""
    dt_min: float = 0.001
    """Initial dt is log-uniform in [dt_min, dt_max]."""
    dt_max: float = 0.1
    """Upper end of the initial dt range."""
    dt_init_floor: float = 1e-4
    """Smallest initial dt."""
    A_floor: float = 1e-4
    """A = -softplus(dd_A) is clamped to at most -A_floor: every head decays at least this much per unit dt."""
    log_decay_min: float | None = None
    """Lower clamp on A x dt, the log of each token's decay (None: none, as mamba-ssm). recurlen's, not mamba-ssm's:
    a model organism whose memories cannot become shorter than -1 / log_decay_min tokens (the Mamba-3 demo's base,
    as GLA's clamp_min is for GLA); mamba-ssm's Mamba3 has no such clamp, so the official export refuses a model
    with one."""
    is_outproj_norm: bool = False
    """Gated RMSNorm (per head, norm before the gate) before out_proj instead of the plain silu(z) gate."""
    is_mimo: bool = False
    """Multi-input multi-output Mamba-3. Not supported: recurlen runs SISO only."""
    chunk_size: int = 64
    """Chunk length of the chunked scan. Any positive value gives the same result; it trades memory for speed."""
    norm_eps: float = 1e-5
    """Epsilon of the blocks' RMSNorms and of the final norm."""
    rms_norm: bool = True
    """RMSNorm (the only norm implemented; False is rejected)."""
    residual_in_fp32: bool = True
    """Keep the residual stream in float32 under mixed precision."""
    initializer_range: float = 0.02
    """Std of the embedding init when training from scratch."""

    def __post_init__(self) -> None:
        if self.is_mimo:
            raise ValueError("model config: is_mimo=True (Mamba-3 MIMO) is not supported; recurlen runs Mamba-3 "
                             "SISO only (is_mimo: false)")
        self.check_positive_ints(("d_model", "n_layer", "vocab_size", "d_state", "expand", "headdim", "ngroups",
                                  "chunk_size", "pad_vocab_size_multiple"))
        if self.rope_fraction not in (0.5, 1.0):
            raise ValueError(f"model config: rope_fraction must be 0.5 or 1.0 (as mamba-ssm); got {self.rope_fraction}")
        if self.d_state % 2 or self.num_rope_angles < 1 or self.num_rope_angles % 2:
            raise ValueError(f"model config: d_state={self.d_state} with rope_fraction={self.rope_fraction} gives "
                             f"{self.num_rope_angles} rotation angles; need an even number >= 2 (d_state >= 8)")
        if not 0 < self.dt_min <= self.dt_max:
            raise ValueError(f"model config: need 0 < dt_min <= dt_max; got {self.dt_min}, {self.dt_max}")
        if not self.A_floor > 0:
            raise ValueError(f"model config: A_floor must be > 0; got {self.A_floor}")
        if self.log_decay_min is not None and not self.log_decay_min < 0:
            raise ValueError(f"model config: log_decay_min must be < 0 (a decay per token below 1) or null; got "
                             f"{self.log_decay_min}")
        if self.d_inner % self.headdim != 0:
            raise ValueError(f"model config: d_inner = expand*d_model = {self.d_inner} must be divisible by "
                             f"headdim={self.headdim}")
        if self.nheads % self.ngroups != 0:
            raise ValueError(f"model config: nheads={self.nheads} must be divisible by ngroups={self.ngroups}")
        if not self.rms_norm:
            raise ValueError("model config: only rms_norm=True is supported")

    # ------------------------------------------------------------------ derived sizes
    @property
    def d_inner(self) -> int:
        return self.expand * self.d_model

    @property
    def nheads(self) -> int:
        return self.d_inner // self.headdim

    @property
    def num_rope_angles(self) -> int:
        """Angles per head: d_state * rope_fraction entries rotated in pairs (rounded down to even, as mamba-ssm)."""
        rotated = int(self.d_state * self.rope_fraction)
        return (rotated - rotated % 2) // 2

    @property
    def d_in_proj(self) -> int:
        """in_proj's rows: [z | x | B | C | dd_dt | dd_A | trap | angles]."""
        return 2 * self.d_inner + 2 * self.ngroups * self.d_state + 3 * self.nheads + self.num_rope_angles

    @property
    def padded_vocab_size(self) -> int:
        return padded(self.vocab_size, self.pad_vocab_size_multiple)

    def describe(self) -> str:
        return (f"Mamba-3 (d_model {self.d_model}, {self.n_layer} layers, d_state {self.d_state}, headdim "
                f"{self.headdim}, rope_fraction {self.rope_fraction})")

    @staticmethod
    def recognises(raw: dict[str, Any]) -> bool:
        """True for a mamba-ssm language model's config.json whose mixer is Mamba3."""
        return "d_model" in raw and (raw.get("ssm_cfg") or {}).get("layer") == LAYER

    # ------------------------------------------------------------------ config.json
    _SSM_KEYS = ("d_state", "expand", "headdim", "ngroups", "rope_fraction", "dt_min", "dt_max", "dt_init_floor",
                 "A_floor", "is_outproj_norm", "chunk_size")

    def to_official_json(self) -> dict[str, Any]:
        """mamba-ssm's language-model config.json with `ssm_cfg.layer: Mamba3` (its Mamba3 constructor's names)."""
        config.refuse_decay_clamp("log_decay_min", self.log_decay_min, target="mamba-ssm's Mamba3",
                                  consequence="the official format would compute another model", model="a Mamba-3")
        return mixer_model_json(self, {"layer": LAYER, **{k: getattr(self, k) for k in self._SSM_KEYS}},
                                hybrid_keys=True)

    @classmethod
    def from_official_json(cls, cfg: dict[str, Any], *, source: str = "config.json") -> Mamba3Config:
        ssm = cfg.get("ssm_cfg") or {}
        if ssm.get("is_mimo"):
            raise ValueError(f"{source}: ssm_cfg.is_mimo=true (Mamba-3 MIMO) is not supported; recurlen runs "
                             "Mamba-3 SISO only")
        return cls(**read_mixer_model_json(
            cfg, source=source, layer=LAYER, wrong_layer=f"this is not a {LAYER} checkpoint",
            supported_ssm=set(cls._SSM_KEYS), ignored_ssm={"is_mimo", "mimo_rank", "dropout"}))


__all__ = ["Mamba3Config"]
