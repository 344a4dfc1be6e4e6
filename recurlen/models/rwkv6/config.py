"""RWKV-6 (Finch) model configuration.

Field names are those of flash-linear-attention's `RWKV6Config`, i.e. of the `config.json` in the fla-hub/rwkv6-*
checkpoints, so an official config maps onto this dataclass 1:1. BlinkDL's `.pth` checkpoints carry no config: their
shape is read off the weights (recurlen.models.rwkv6.checkpoint) into the same fields. Options recurlen does not run
(hybrid attention layers, another channel-mix activation, no pre-norm) are refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from recurlen.models.rwkv_common import RWKVConfig


@dataclass
class RWKV6Config(RWKVConfig):
    """RWKVConfig's shared fields (sizes, channel mix, norms, vocabulary) and RWKV-6's own below."""

    num_heads: int = 2
    """Heads; each holds a (head_dim x head_v_dim) WKV state. BlinkDL's world models use heads of 64."""
    expand_k: float = 1.0
    """key_dim = hidden_size * expand_k (the world models: 1; fla's default 0.5)."""
    expand_v: float = 1.0
    """value_dim = hidden_size * expand_v."""
    hidden_ratio: float | None = 3.5
    """Channel-mix width when intermediate_size is None: hidden_size * hidden_ratio, rounded up to 32."""
    proj_low_rank_dim: int = 32
    """Rank of the data-dependent token-shift mix (BlinkDL: time_maa_w1 is hidden x 5 * this)."""
    gate_low_rank_dim: int = 64
    """Rank of the data-dependent decay (BlinkDL: time_decay_w1 is hidden x this)."""
    decay_init_range: tuple[float, float] | None = None
    """None: fla's from-scratch decay bias (time_decay, w_t = exp(-exp(bias + ...))) of zero, every channel at
    exp(-1) = 0.37 per token. A range [lo, hi]: that bias spread linearly over each head's key channels from lo to hi
    (BlinkDL's span is -6 .. -1: decays 0.9975 .. 0.69; the demo's -8 .. -4). Only used when training from
    scratch."""
    chunk_size: int = 64
    """Chunk length of the pure-PyTorch scan (any value gives the same result; multiples of 16 are fastest)."""

    MODEL_TYPE = "rwkv6"
    TITLE = "an RWKV-6"
    RECURLEN_ONLY = frozenset({"chunk_size", "decay_init_range", "head_norm_eps"})

    def __post_init__(self) -> None:
        self.check_range("decay_init_range")
        self.check_positive_ints(("hidden_size", "num_hidden_layers", "num_heads", "proj_low_rank_dim",
                                  "gate_low_rank_dim", "vocab_size", "chunk_size"))
        self.check_head_dims()
        self.check_rwkv()

    # ------------------------------------------------------------------ derived sizes
    @property
    def head_dim(self) -> int:
        """Key channels per head (BlinkDL: head_size_a, 64 in the world models)."""
        return self.key_dim // self.num_heads

    @property
    def group_norm_eps(self) -> float:
        """fla's RWKV-6: norm_eps itself unless head_norm_eps is set."""
        return self.norm_eps if self.head_norm_eps is None else self.head_norm_eps

    def describe(self) -> str:
        return (f"RWKV-6 (hidden {self.hidden_size}, {self.num_hidden_layers} layers, {self.num_heads} heads of "
                f"{self.head_dim} x {self.head_v_dim})")

    # ------------------------------------------------------------------ official config.json
    def to_official_json(self) -> dict[str, Any]:
        """fla's RWKV6Config as written by `save_pretrained` (model_type 'rwkv6')."""
        return self.official_json(architectures=["RWKV6ForCausalLM"], attn=None, fuse_norm=True)

    @classmethod
    def from_official_json(cls, cfg: dict[str, Any], *, source: str = "config.json") -> RWKV6Config:
        # use_short_conv, use_glu: options of older fla releases that no RWKV-6 checkpoint uses
        return cls(**cls.official_kwargs(cfg, source=source,
                                         refused={"attn": None, "use_short_conv": False, "use_glu": False}))


__all__ = ["RWKV6Config"]
