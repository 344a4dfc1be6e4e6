"""The recurrent state of a Mamba-1 language model.

Legend: K layers, B lanes, D d_inner channels, N d_state, W conv window (d_conv - 1).

`ssm` is h_t of every layer, one N-vector per channel (Mamba-1 has no heads: every channel has
its own decays), float32 always. `conv` holds the last W inputs of the depthwise causal conv on x.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from recurlen.models.state import LayeredState


@dataclass
class Mamba1State(LayeredState):
    ssm: torch.Tensor  # (K, B, D, N) float32
    conv: torch.Tensor  # (K, B, D, W)

    RECURRENT: ClassVar[tuple[str, ...]] = ("ssm",)
    WINDOW: ClassVar[tuple[str, ...]] = ("conv",)
    # No heads: fitted noise is fitted per layer (one mean and std over all channels and state entries).
    GROUP_DIMS: ClassVar[dict[str, int]] = {"ssm": 0}

    def __post_init__(self) -> None:
        if self.ssm.dim() != 4 or self.conv.dim() != 4:
            raise ValueError("Mamba1State needs ssm (layers, batch, d_inner, d_state) and conv (layers, batch, "
                             f"d_inner, d_conv-1); got {tuple(self.ssm.shape)} and {tuple(self.conv.shape)}")
        super().__post_init__()

    @classmethod
    def zeros_for(cls, config, batch: int, *, device: torch.device | str | None = None) -> Mamba1State:
        lead = (config.n_layer, batch)
        return cls(torch.zeros(*lead, config.d_inner, config.d_state, device=device),
                   torch.zeros(*lead, config.d_inner, config.d_conv - 1, device=device))


__all__ = ["Mamba1State"]
