"""The recurrent state of a Mamba-2 language model, as a type.

Shape legend (used in names across recurlen):
  K  layers            B  batch rows (lanes)    H  SSM heads       P  head dim
  N  SSM state size    C  conv channels         W  conv window (d_conv - 1)

`ssm_KBHPN` is the SSD state h_t of every layer, float32 always: it accumulates over
arbitrarily many tokens and is the quantity the paper's diagnostics look at.
`conv_KBCW` holds the last W *inputs* of the depthwise causal conv of every layer
(the conv is the only other thing that remembers the past), in the model's dtype.

The lane operations (reset, detach, index / cat lanes, to, state_dict, norms) are LayeredState's,
shared by every architecture's state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from recurlen.layered_state import LayeredState


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
        if self.ssm.shape[:2] != self.conv.shape[:2]:
            raise ValueError(
                f"state.ssm and state.conv disagree on (layers, batch): {tuple(self.ssm.shape[:2])} vs "
                f"{tuple(self.conv.shape[:2])}"
            )

    # ------------------------------------------------------------------ creation
    @classmethod
    def zeros(
        cls,
        *,
        n_layer: int,
        batch: int,
        nheads: int,
        headdim: int,
        d_state: int,
        conv_dim: int,
        d_conv: int,
        device: torch.device | str | None = None,
        conv_dtype: torch.dtype = torch.float32,
    ) -> RecurrentState:
        ssm = torch.zeros(n_layer, batch, nheads, headdim, d_state, device=device, dtype=torch.float32)
        conv = torch.zeros(n_layer, batch, conv_dim, d_conv - 1, device=device, dtype=conv_dtype)
        return cls(ssm, conv)

    @classmethod
    def stack_layers(cls, ssm_per_layer: Sequence[torch.Tensor],
                     conv_per_layer: Sequence[torch.Tensor]) -> RecurrentState:
        return cls(torch.stack(list(ssm_per_layer)), torch.stack(list(conv_per_layer)))

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.ssm[i], self.conv[i]

    def with_ssm_only(self) -> RecurrentState:
        """The SSM state with the conv window zeroed: what the paper's pseudocode passes."""
        return self.recurrent_only()

    # ------------------------------------------------------------------ checks
    def check_compatible(self, *, n_layer: int, batch: int, nheads: int, headdim: int, d_state: int,
                         conv_dim: int, d_conv: int, device: torch.device) -> None:
        want_ssm = (n_layer, batch, nheads, headdim, d_state)
        want_conv = (n_layer, batch, conv_dim, d_conv - 1)
        if tuple(self.ssm.shape) != want_ssm:
            raise ValueError(
                f"state.ssm has shape {tuple(self.ssm.shape)}; this model and batch need {want_ssm} "
                "(layers, batch, heads, headdim, d_state)"
            )
        if tuple(self.conv.shape) != want_conv:
            raise ValueError(
                f"state.conv has shape {tuple(self.conv.shape)}; this model and batch need {want_conv} "
                "(layers, batch, conv_dim, d_conv-1)"
            )
        if self.ssm.dtype not in (torch.float32, torch.float64):
            raise ValueError(f"state.ssm must be float32 (it accumulates over long inputs; float64 is allowed "
                             f"for double-precision checks); got {self.ssm.dtype}")
        if not self.conv.dtype.is_floating_point:
            raise ValueError(f"state.conv must be a floating-point tensor; got {self.conv.dtype}")
        if self.ssm.device.type != device.type or self.conv.device.type != device.type:
            raise ValueError(f"state is on {self.ssm.device}/{self.conv.device} but the model is on {device}")
