"""RWKV-7 ("Goose", arXiv 2503.14456) model configuration.

Field names are those of flash-linear-attention's `RWKV7Config`, i.e. of the `config.json` in the fla-hub/rwkv7-*
checkpoints, so an official config maps onto this dataclass 1:1. BlinkDL's x070 `.pth` checkpoints carry no config:
their shape is read off the weights (recurlen.models.rwkv7.checkpoint) into the same fields. Options recurlen does
not run (hybrid attention layers, value_dim wider than hidden_size, another channel-mix activation, no embedding
norm) are refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from recurlen.models import config
from recurlen.models.rwkv7.scan import LOG_DECAY_FLOOR
from recurlen.models.rwkv_common import RWKVConfig

MAX_CHUNK = 64
"""The pure-PyTorch scan factors each pair's decay as exp(c_t - m) exp(m - c_s) around the chunk's midpoint m; a
decay per token is at least exp(-exp(-1/2)) = 0.545, so a chunk of 64 spans at most exp(+-19.4) (recurlen.models.
rwkv7.scan): far inside float32's range. Longer chunks would drift towards its limits, and are no faster."""


@dataclass
class RWKV7Config(RWKVConfig):
    """RWKVConfig's shared fields (sizes, channel mix, norms, vocabulary) and RWKV-7's own below."""

    head_dim: int = 64
    """Key (= value) channels per head; each head holds a (head_dim x head_dim) WKV state. The world models: 64."""
    num_heads: int | None = None
    """hidden_size / head_dim (fla derives it; given, it must agree)."""
    decay_low_rank_dim: int = 64
    """Rank of the data-dependent decay w (BlinkDL: w1 is hidden x this)."""
    gate_low_rank_dim: int = 128
    """Rank of the output gate g (BlinkDL: g1)."""
    a_low_rank_dim: int = 64
    """Rank of the in-context learning rate a (BlinkDL: a1)."""
    v_low_rank_dim: int = 16
    """Rank of the value residual's mix towards the first layer's value (BlinkDL: v1; layers after the first)."""
    decay_offset_range: tuple[float, float] | None = None
    """None: fla's from-scratch decay offset (BlinkDL's w0, the bias of w_lora), ramped over channels and layers
    from about -8 to +3: decays exp(-exp(-1/2) sigmoid(w0)) from 0.9998 to 0.56 per token at zero data-dependent
    input. A range [lo, hi]: w0 spread linearly over each head's channels from lo to hi instead ([-8, -4]: memories of
    ~90 to ~5000 tokens, the demo's slow start). Only used when training from scratch."""
    log_decay_min: float | None = None
    """Lower clamp on the log decay per token, log w (None: none, as fla and BlinkDL). recurlen's, not RWKV-7's: a
    model organism whose channels each keep at least exp(log_decay_min) per token (at -0.001: memories of >= 1000
    tokens), however the data-dependent decay moves; no gradient flows below it. The Mamba-3 and Gated DeltaNet
    demos' clamps are the same device. Neither fla's RWKV7 nor BlinkDL's .pth can express it, so both official
    exports refuse a model with one."""
    zero_residual_init: bool = True
    """fla's (and BlinkDL's) from-scratch init: the time mix's o_proj and the channel mix's value start at zero, so
    an untrained block adds nothing to the residual stream and does not read its state. False: both start as fla's
    other models' residual outputs do (Kaiming-uniform / sqrt(2 layers)); the nano test model uses it, since the
    shared contract tests need a fresh model whose output depends on its state. Only used when training from
    scratch."""
    chunk_size: int = 32
    """Chunk length of the pure-PyTorch scan, at most 64 (any value gives the same result)."""

    MODEL_TYPE = "rwkv7"
    TITLE = "an RWKV-7"
    RECURLEN_ONLY = frozenset({"chunk_size", "head_norm_eps", "zero_residual_init", "decay_offset_range",
                               "log_decay_min"})

    def __post_init__(self) -> None:
        self.check_range("decay_offset_range")
        self.check_positive_ints(("hidden_size", "num_hidden_layers", "head_dim", "decay_low_rank_dim",
                                  "gate_low_rank_dim", "a_low_rank_dim", "v_low_rank_dim", "vocab_size",
                                  "chunk_size"))
        if self.hidden_size % self.head_dim:
            raise ValueError(f"model config: hidden_size={self.hidden_size} must be a multiple of "
                             f"head_dim={self.head_dim}")
        derived = self.hidden_size // self.head_dim
        if self.num_heads is None:
            self.num_heads = derived
        elif self.num_heads != derived:
            raise ValueError(f"model config: num_heads={self.num_heads} disagrees with hidden_size / head_dim = "
                             f"{derived}")
        if self.chunk_size > MAX_CHUNK:
            raise ValueError(f"model config: chunk_size={self.chunk_size} is above {MAX_CHUNK} (the scan's decays "
                             "are factored per chunk; see recurlen.models.rwkv7.scan)")
        self.check_rwkv()
        if self.log_decay_min is not None and not LOG_DECAY_FLOOR < self.log_decay_min < 0:
            raise ValueError(f"model config: log_decay_min must be null or in ({LOG_DECAY_FLOOR:.6f}, 0) (a log "
                             f"decay per token above RWKV-7's own floor); got {self.log_decay_min}")

    # ------------------------------------------------------------------ derived sizes (fla's layer)
    @property
    def key_dim(self) -> int:
        return self.hidden_size

    @property
    def value_dim(self) -> int:
        return self.hidden_size

    @property
    def head_v_dim(self) -> int:
        return self.head_dim

    @property
    def group_norm_eps(self) -> float:
        """fla's RWKV-7: head_dim * norm_eps unless head_norm_eps is set (BlinkDL's code: 64e-5 for every head size,
        the same for its heads of 64)."""
        return self.head_dim * self.norm_eps if self.head_norm_eps is None else self.head_norm_eps

    def describe(self) -> str:
        return (f"RWKV-7 (hidden {self.hidden_size}, {self.num_hidden_layers} layers, {self.num_heads} heads of "
                f"{self.head_dim} x {self.head_dim})")

    # ------------------------------------------------------------------ official config.json
    def to_official_json(self) -> dict[str, Any]:
        """fla's RWKV7Config as written by `save_pretrained` (model_type 'rwkv7')."""
        refuse_decay_clamp(self, "fla's RWKV7 config.json")
        return self.official_json(architectures=["RWKV7ForCausalLM"], attn=None, fuse_norm=True,
                                  value_dim=[self.hidden_size] * self.num_hidden_layers)

    @classmethod
    def from_official_json(cls, cfg: dict[str, Any], *, source: str = "config.json") -> RWKV7Config:
        value_dim = cfg.get("value_dim")
        hidden = cfg.get("hidden_size")
        if value_dim is not None and any(v != hidden for v in (value_dim if isinstance(value_dim, list)
                                                                else [value_dim])):
            raise ValueError(f"{source}: value_dim={value_dim!r} is not supported (recurlen's RWKV-7 has value_dim "
                             f"= hidden_size = {hidden} in every layer)")
        return cls(**cls.official_kwargs(cfg, source=source, refused={"attn": None}))


def refuse_decay_clamp(cfg: RWKV7Config, target: str) -> None:
    """The official formats compute RWKV-7 without recurlen's log_decay_min: writing one would be another model."""
    config.refuse_decay_clamp("log_decay_min", cfg.log_decay_min, target=target,
                              consequence="the official format would compute another model", model="an RWKV-7")


__all__ = ["MAX_CHUNK", "RWKV7Config", "refuse_decay_clamp"]
