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

from recurlen.layered_state import LayeredState


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
    def zeros(cls, *, n_layer: int, batch: int, nheads: int, head_k_dim: int, head_v_dim: int, conv_channels: int,
              conv_size: int, device: torch.device | str | None = None) -> GLAState:
        return cls(torch.zeros(n_layer, batch, nheads, head_k_dim, head_v_dim, device=device, dtype=torch.float32),
                   torch.zeros(n_layer, batch, conv_channels, conv_size - 1, device=device, dtype=torch.float32))


__all__ = ["GLAState"]
