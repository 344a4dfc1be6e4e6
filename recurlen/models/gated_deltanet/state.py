"""The recurrent state of a Gated DeltaNet language model.

Legend: K layers, B lanes, H value heads (num_v_heads), Dk / Dv head key / value dims, C conv channels, W window.

Per layer:
  kv    each value head's state S_t (Dk x Dv), key-major (fla's `state_v_first=False` layout), float32 always:
        S_t = exp(g_t) (I - beta_t k_t k_t^T) S_t-1 + beta_t k_t v_t^T. RECURRENT: the noise interventions draw it,
        fitted noise fits it per (layer, value head), state passing and TBTT always carry it.
  conv  the last W = conv_size - 1 inputs of the q, k and v short convs side by side (fla's default models have
        them); an empty (K, B, 0, W) tensor without short convs. WINDOW: carried by state passing only with
        `pass_conv`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from recurlen.models.state import LayeredState


@dataclass
class GatedDeltaNetState(LayeredState):
    kv: torch.Tensor  # (K, B, H, Dk, Dv) float32
    conv: torch.Tensor  # (K, B, C, W), C = 0 without short convs

    RECURRENT: ClassVar[tuple[str, ...]] = ("kv",)
    WINDOW: ClassVar[tuple[str, ...]] = ("conv",)
    GROUP_DIMS: ClassVar[dict[str, int]] = {"kv": 1}  # fitted noise per (layer, value head)

    def __post_init__(self) -> None:
        if self.kv.dim() != 5 or self.conv.dim() != 4:
            raise ValueError("GatedDeltaNetState needs kv (layers, batch, value heads, head_dim, head_v_dim) and conv "
                             f"(layers, batch, channels, conv_size-1); got {tuple(self.kv.shape)} and "
                             f"{tuple(self.conv.shape)}")
        super().__post_init__()

    @classmethod
    def zeros_for(cls, config, batch: int, *, device: torch.device | str | None = None) -> GatedDeltaNetState:
        lead = (config.num_hidden_layers, batch)
        return cls(torch.zeros(*lead, config.num_v_heads, config.head_dim, config.head_v_dim, device=device),
                   torch.zeros(*lead, config.conv_channels, config.conv_size - 1, device=device))


__all__ = ["GatedDeltaNetState"]
