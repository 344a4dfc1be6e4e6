"""The recurrent state of a Mamba-2 language model, as a type.

Shape legend (used in names across recurlen):
  K  layers            B  batch rows (lanes)    H  SSM heads       P  head dim
  N  SSM state size    C  conv channels         W  conv window (d_conv - 1)

`ssm_KBHPN` is the SSD state h_t of every layer, float32 always: it accumulates over
arbitrarily many tokens and is the quantity the paper's diagnostics look at.
`conv_KBCW` holds the last W *inputs* of the depthwise causal conv of every layer
(the conv is the only other thing that remembers the past), in the model's dtype.

The lane operations (reset, detach, index / cat lanes, to, state_dict, norms, checks) are LayeredState's,
shared by every architecture's state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from recurlen.models.state import LayeredState


@dataclass
class RecurrentState(LayeredState):
    ssm: torch.Tensor  # (K, B, H, P, N) float32
    conv: torch.Tensor  # (K, B, C, W)

    RECURRENT: ClassVar[tuple[str, ...]] = ("ssm",)
    WINDOW: ClassVar[tuple[str, ...]] = ("conv",)
    GROUP_DIMS: ClassVar[dict[str, int]] = {"ssm": 1}  # fitted noise per (layer, head)

    def __post_init__(self) -> None:
        if self.ssm.dim() != 5:
            raise ValueError("state.ssm must be 5-d (layers, batch, heads, headdim, d_state); "
                             f"got {tuple(self.ssm.shape)}")
        if self.conv.dim() != 4:
            raise ValueError("state.conv must be 4-d (layers, batch, conv_dim, d_conv-1); "
                             f"got {tuple(self.conv.shape)}")
        super().__post_init__()

    @classmethod
    def zeros_for(cls, config, batch: int, *, device: torch.device | str | None = None) -> RecurrentState:
        lead = (config.n_layer, batch)
        return cls(torch.zeros(*lead, config.nheads, config.headdim, config.d_state, device=device),
                   torch.zeros(*lead, config.conv_dim, config.d_conv - 1, device=device))


__all__ = ["RecurrentState"]
