"""The recurrent state of a GLA language model.

Legend: K layers, B lanes, H heads, Dk / Dv head key / value dims, C conv channels, W conv window.

`kv` is every layer's per-head key-value state S_t (Dk x Dv), float32 always. `conv` holds the last
W inputs of the q, k and v short convs side by side when the model has them (use_short_conv); for
the fla-hub models, which have none, it is an empty (K, B, 0, W) tensor so that every lane operation
works the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from recurlen.models.state import LayeredState


@dataclass
class GLAState(LayeredState):
    kv: torch.Tensor  # (K, B, H, Dk, Dv) float32
    conv: torch.Tensor  # (K, B, C, W), C = 0 without short convs

    RECURRENT: ClassVar[tuple[str, ...]] = ("kv",)
    WINDOW: ClassVar[tuple[str, ...]] = ("conv",)
    GROUP_DIMS: ClassVar[dict[str, int]] = {"kv": 1}  # fitted noise per (layer, head)

    def __post_init__(self) -> None:
        if self.kv.dim() != 5 or self.conv.dim() != 4:
            raise ValueError("GLAState needs kv (layers, batch, heads, head_k_dim, head_v_dim) and conv (layers, "
                             f"batch, channels, conv_size-1); got {tuple(self.kv.shape)} and {tuple(self.conv.shape)}")
        super().__post_init__()

    @classmethod
    def zeros_for(cls, config, batch: int, *, device: torch.device | str | None = None) -> GLAState:
        lead = (config.num_hidden_layers, batch)
        return cls(torch.zeros(*lead, config.num_heads, config.head_k_dim, config.head_v_dim, device=device),
                   torch.zeros(*lead, config.conv_channels, config.conv_size - 1, device=device))


__all__ = ["GLAState"]
