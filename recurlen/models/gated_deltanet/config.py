"""Gated DeltaNet model configuration.

Field names are those of flash-linear-attention's `GatedDeltaNetConfig` (model_type 'gated_deltanet'), so its
`config.json` maps onto this dataclass 1:1. Sizes follow fla's layer: q and k have num_heads heads of head_dim; v
has num_v_heads heads of head_dim * expand_v (grouped value heads when num_v_heads > num_heads: each q / k head
serves num_v_heads / num_heads value heads, each value head holding its own state). Options recurlen does not run
(hybrid attention layers, attention residuals) are refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from recurlen.models import config
from recurlen.models.fla_model import FlaConfig, swiglu_width

GATE_ACTIVATIONS = ("swish", "silu", "sigmoid")


@dataclass
class GatedDeltaNetConfig(FlaConfig):
    hidden_size: int = 128
    """Width of the residual stream."""
    num_hidden_layers: int = 2
    """Number of blocks (Gated DeltaNet token mixer + gated MLP each)."""
    num_heads: int = 2
    """Query / key heads."""
    head_dim: int = 32
    """Key (and query) dim per head."""
    num_v_heads: int | None = None
    """Value heads, each with its own (head_dim x head_v_dim) state and decay; None = num_heads. More than num_heads:
    grouped value heads (a multiple of num_heads)."""
    expand_v: float = 2.0
    """head_v_dim = head_dim * expand_v."""
    hidden_ratio: int | None = 4
    """MLP width when intermediate_size is None: 2/3 * hidden_size * hidden_ratio, rounded up to 256."""
    intermediate_size: int | None = None
    vocab_size: int = 257
    tie_word_embeddings: bool = False
    use_gate: bool = True
    """o = rmsnorm(o) * act(g_proj(x)) per head; without it a plain per-head RMSNorm."""
    output_gate_activation: str = "swish"
    use_short_conv: bool = True
    """Short causal convs (+ SiLU) on q, k, v; their windows are then part of the state. Without them q, k, v
    pass through SiLU alone."""
    conv_size: int = 4
    allow_neg_eigval: bool = False
    """beta = 2 sigmoid(b_proj(x)) in (0, 2): the transition I - beta k k^T may have a negative eigenvalue."""
    hidden_act: str = "swish"
    norm_eps: float = 1e-6
    attn_mode: str = "chunk"
    """fla's kernel choice ('chunk' / 'fused_recurrent'); the same function, kept for the official config."""
    initializer_range: float = 0.02
    clamp_min: float | None = None
    """Lower clamp on the log decay g (None: no clamp, as fla's layer). A model-organism setting, as GLA's clamp_min:
    at -0.01 every decay is >= 0.99 per token (memories of >= 100 tokens), however the gate input moves. fla's
    GatedDeltaNet layer has no clamp (unlike GLA's), so fla's config.json cannot express it: the official export
    refuses a model with one; recurlen's own checkpoints and recurlen_config.json keep it."""
    A_init_range: tuple[float, float] | None = None
    """None: fla's from-scratch A, uniform in (0, 16) (with dt in [0.001, 0.1], per-token decays exp(-A dt) of
    0.2 .. 1: memories of ~1 to ~1000 tokens, most a few tokens). A range [lo, hi] with lo > 0: A log-uniform in it
    (the Mamba-2 demo's [0.001, 0.1] gives memories of ~100 to ~10^6 tokens). Only used when training from
    scratch."""
    chunk_size: int = 64
    """Chunk length of the pure-PyTorch scan (any value gives the same result)."""

    MODEL_TYPE = "gated_deltanet"
    TITLE = "a Gated DeltaNet"
    RECURLEN_ONLY = frozenset({"chunk_size", "A_init_range", "clamp_min"})

    def __post_init__(self) -> None:
        self.check_range("A_init_range")
        if self.A_init_range is not None and not self.A_init_range[0] > 0:
            raise ValueError(f"model config: A_init_range must satisfy 0 < low <= high; got {self.A_init_range}")
        if self.num_v_heads is None:
            self.num_v_heads = self.num_heads
        self.check_positive_ints(("hidden_size", "num_hidden_layers", "num_heads", "num_v_heads", "head_dim",
                                  "vocab_size", "conv_size", "chunk_size"))
        if self.num_v_heads % self.num_heads:
            raise ValueError(f"model config: num_v_heads={self.num_v_heads} must be a multiple of "
                             f"num_heads={self.num_heads}")
        if self.expand_v <= 0 or self.head_dim * self.expand_v != int(self.head_dim * self.expand_v):
            raise ValueError(f"model config: head_dim * expand_v must be a positive integer; got head_dim="
                             f"{self.head_dim}, expand_v={self.expand_v}")
        if self.intermediate_size is None and (self.hidden_ratio is None or self.hidden_ratio <= 0):
            raise ValueError("model config: give intermediate_size or a positive hidden_ratio")
        if self.hidden_act != "swish":
            raise ValueError(f"model config: hidden_act={self.hidden_act!r} is not supported; allowed: 'swish'")
        if self.output_gate_activation not in GATE_ACTIVATIONS:
            raise ValueError(f"model config: output_gate_activation={self.output_gate_activation!r}; allowed: "
                             f"{list(GATE_ACTIVATIONS)}")
        if self.attn_mode not in ("chunk", "fused_recurrent"):
            raise ValueError(f"model config: attn_mode={self.attn_mode!r}; allowed: ['chunk', 'fused_recurrent']")
        if self.clamp_min is not None and not self.clamp_min < 0:
            raise ValueError(f"model config: clamp_min must be null or < 0 (a log decay); got {self.clamp_min}")
        if self.use_short_conv and self.conv_size < 2:
            raise ValueError(f"model config: conv_size must be >= 2 with use_short_conv; got {self.conv_size}")

    # ------------------------------------------------------------------ derived sizes (fla's layer)
    @property
    def key_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def head_v_dim(self) -> int:
        return int(self.head_dim * self.expand_v)

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.head_v_dim

    @property
    def v_groups(self) -> int:
        """Value heads per query / key head."""
        return self.num_v_heads // self.num_heads

    @property
    def mlp_size(self) -> int:
        return swiglu_width(self.hidden_size, self.hidden_ratio, self.intermediate_size)

    @property
    def conv_channels(self) -> int:
        """q, k and v conv windows side by side (0 without short convs)."""
        return 2 * self.key_dim + self.value_dim if self.use_short_conv else 0

    def describe(self) -> str:
        groups = f" ({self.num_v_heads} value heads)" if self.v_groups > 1 else ""
        return (f"Gated DeltaNet (hidden {self.hidden_size}, {self.num_hidden_layers} layers, {self.num_heads} heads "
                f"of {self.head_dim} x {self.head_v_dim}{groups}{', short convs' if self.use_short_conv else ''})")

    # ------------------------------------------------------------------ official config.json
    def to_official_json(self) -> dict[str, Any]:
        """fla's GatedDeltaNetConfig as written by `save_pretrained`."""
        refuse_decay_clamp(self, "fla's GatedDeltaNet config.json")
        return self.official_json(architectures=["GatedDeltaNetForCausalLM"], attn=None, attnres_block_size=None,
                                  fuse_norm=True, fuse_swiglu=True, fuse_cross_entropy=True, use_cache=True)

    @classmethod
    def from_official_json(cls, cfg: dict[str, Any], *, source: str = "config.json") -> GatedDeltaNetConfig:
        kwargs = cls.official_kwargs(cfg, source=source, refused={"attn": None, "attnres_block_size": None})
        # recurlen's exports wrote clamp_min into config.json before they refused it: such a model was trained
        # with its clamp, so it keeps it (fla's own configs have no clamp_min)
        return cls(**kwargs, clamp_min=cfg.get("clamp_min"))


def refuse_decay_clamp(cfg: GatedDeltaNetConfig, target: str) -> None:
    """fla computes Gated DeltaNet without recurlen's clamp_min: writing one would be another model."""
    config.refuse_decay_clamp("clamp_min", cfg.clamp_min, target=target,
                              consequence="fla's model would compute another model from these weights",
                              model="a Gated DeltaNet")


__all__ = ["GatedDeltaNetConfig", "refuse_decay_clamp"]
