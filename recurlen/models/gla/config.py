"""GLA (gated linear attention) model configuration.

Field names are those of flash-linear-attention's `GLAConfig`, i.e. of the `config.json` in the
fla-hub/gla-* checkpoints, so an official config maps onto this dataclass 1:1. Options the
checkpoints do not use and recurlen does not implement (hybrid attention layers, feature maps,
other gate activations) are refused with a clear error instead of being silently ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from recurlen.models.fla_model import FlaConfig, swiglu_width


@dataclass
class GLAConfig(FlaConfig):
    hidden_size: int = 128
    """Width of the residual stream."""
    num_hidden_layers: int = 2
    """Number of blocks (GLA token mixer + gated MLP each)."""
    num_heads: int = 2
    """Heads; each holds a (head_k_dim x head_v_dim) key-value state."""
    num_kv_heads: int | None = None
    """Key/value heads (multi-query style); None = num_heads."""
    expand_k: float = 0.5
    """key_dim = hidden_size * expand_k."""
    expand_v: float = 1.0
    """value_dim = hidden_size * expand_v."""
    hidden_ratio: int = 4
    """MLP width when intermediate_size is None: 2/3 * hidden_size * hidden_ratio, rounded up to 256."""
    intermediate_size: int | None = None
    vocab_size: int = 257
    tie_word_embeddings: bool = False
    """LM head shares the embedding matrix."""
    use_short_conv: bool = False
    """Short causal convs (+ SiLU) on q, k, v; their windows are then part of the state."""
    conv_size: int = 4
    conv_bias: bool = False
    use_output_gate: bool = True
    """o = rmsnorm(o) * swish(g_proj(x)) per head (the fla-hub models)."""
    hidden_act: str = "swish"
    clamp_min: float | None = None
    """Lower clamp on the log forget gates (None: no clamp)."""
    gate_logit_normalizer: float = 16.0
    """log forget gate = logsigmoid(gk_proj(x)) / gate_logit_normalizer."""
    gate_bias_init_range: tuple[float, float] | None = None
    """None: fla's zero bias of gk_proj's second layer (forget gates start near sigmoid(0)^(1/16) = 0.958, memories
    of ~23 tokens). A range: that bias is sampled uniformly in it per key channel; a positive range makes the
    gates start closer to 1 (slowly decaying memories). Only used when training from scratch."""
    gate_low_rank_dim: int = 16
    """gk_proj is a low-rank pair: hidden_size -> this -> key_dim."""
    norm_eps: float = 1e-6
    elementwise_affine: bool = True
    fuse_norm: bool = True
    """Only decides a parameter name: the output norm is `g_norm_swish_gate` (fused) or `g_norm`."""
    initializer_range: float = 0.02
    chunk_size: int = 64
    """Chunk length of the pure-PyTorch scan (any value gives the same result; multiples of 16 are fastest)."""

    MODEL_TYPE = "gla"
    TITLE = "a GLA"
    RECURLEN_ONLY = frozenset({"chunk_size", "gate_bias_init_range"})

    def __post_init__(self) -> None:
        self.check_range("gate_bias_init_range")
        if self.num_kv_heads is None:
            self.num_kv_heads = self.num_heads
        self.check_positive_ints(("hidden_size", "num_hidden_layers", "num_heads", "num_kv_heads", "hidden_ratio",
                                  "vocab_size", "conv_size", "gate_low_rank_dim", "chunk_size"))
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"model config: num_heads={self.num_heads} must be divisible by "
                             f"num_kv_heads={self.num_kv_heads}")
        self.check_head_dims()
        if self.hidden_act != "swish":
            raise ValueError(f"model config: hidden_act={self.hidden_act!r} is not supported; allowed: 'swish'")
        if self.use_short_conv and self.conv_size < 2:
            raise ValueError(f"model config: conv_size must be >= 2 with use_short_conv; got {self.conv_size}")
        if self.gate_logit_normalizer <= 0:
            raise ValueError(f"model config: gate_logit_normalizer must be > 0; got {self.gate_logit_normalizer}")

    # ------------------------------------------------------------------ derived sizes
    @property
    def kv_groups(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def head_k_dim(self) -> int:
        return self.key_dim // self.num_heads

    @property
    def mlp_size(self) -> int:
        return swiglu_width(self.hidden_size, self.hidden_ratio, self.intermediate_size)

    @property
    def conv_channels(self) -> int:
        """q, k and v conv windows side by side (0 without short convs)."""
        g = self.kv_groups
        return self.key_dim + self.key_dim // g + self.value_dim // g if self.use_short_conv else 0

    def describe(self) -> str:
        return (f"GLA (hidden {self.hidden_size}, {self.num_hidden_layers} layers, {self.num_heads} heads of "
                f"{self.head_k_dim} x {self.head_v_dim}{', short convs' if self.use_short_conv else ''})")

    # ------------------------------------------------------------------ official config.json
    def to_official_json(self) -> dict[str, Any]:
        """fla's GLAConfig as written by `save_pretrained` (model_type 'gla')."""
        return self.official_json(architectures=["GLAForCausalLM"], attn=None, attn_mode="chunk", feature_map=None,
                                  use_gk=True, use_gv=False)

    @classmethod
    def from_official_json(cls, cfg: dict[str, Any], *, source: str = "config.json") -> GLAConfig:
        kwargs = cls.official_kwargs(cfg, source=source,
                                     refused={"attn": None, "feature_map": None, "use_gk": True, "use_gv": False})
        if "norm_eps" not in cfg and "rms_norm_eps" in cfg:  # older fla configs
            kwargs["norm_eps"] = cfg["rms_norm_eps"]
        return cls(**kwargs)


__all__ = ["GLAConfig"]
