"""The recurrent state of an RWKV-6 language model.

Legend: K layers, B lanes, H heads, Dk head key dim, Dv head value dim, D hidden size.

Per layer:
  wkv        the WKV matrix state S_t (H, Dk, Dv), float32 always. It is the recurrence: S_t = diag(w_t) S_t-1 +
             k_t^T v_t with a data-dependent decay w_t per key channel, so it summarises the whole past and drifts
             with position like Mamba's SSM state. It is RECURRENT: the noise interventions draw it, fitted noise
             fits it per (layer, head), state passing and TBTT always carry it.
  att_shift  the time mix's token shift: the last token's normalised input (D,). It is a window of one token,
             like Mamba's conv window (the last d_conv-1 inputs): it holds no memory beyond the previous token, is
             exactly what the first token of the next call needs to mix with, and carries no drift. WINDOW.
  ffn_shift  the channel mix's token shift, the same for the second half of the block. WINDOW.

Windows are carried by state passing only with `pass_conv` (as Mamba's conv windows are); zeroing them costs one
token of context at a segment boundary, which the split-invariance tests measure (tests/models/rwkv6/).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from recurlen.models.state import LayeredState


@dataclass
class RWKV6State(LayeredState):
    wkv: torch.Tensor  # (K, B, H, Dk, Dv) float32
    att_shift: torch.Tensor  # (K, B, D)
    ffn_shift: torch.Tensor  # (K, B, D)

    RECURRENT: ClassVar[tuple[str, ...]] = ("wkv",)
    WINDOW: ClassVar[tuple[str, ...]] = ("att_shift", "ffn_shift")
    GROUP_DIMS: ClassVar[dict[str, int]] = {"wkv": 1}  # fitted noise per (layer, head)

    def __post_init__(self) -> None:
        if self.wkv.dim() != 5 or self.att_shift.dim() != 3 or self.ffn_shift.dim() != 3:
            raise ValueError("RWKV6State needs wkv (layers, batch, heads, head_dim, head_v_dim), att_shift and "
                             f"ffn_shift (layers, batch, hidden); got {tuple(self.wkv.shape)}, "
                             f"{tuple(self.att_shift.shape)} and {tuple(self.ffn_shift.shape)}")
        super().__post_init__()

    @classmethod
    def zeros_for(cls, config, batch: int, *, device: torch.device | str | None = None) -> RWKV6State:
        lead = (config.num_hidden_layers, batch)
        return cls(torch.zeros(*lead, config.num_heads, config.head_dim, config.head_v_dim, device=device),
                   torch.zeros(*lead, config.hidden_size, device=device),
                   torch.zeros(*lead, config.hidden_size, device=device))


__all__ = ["RWKV6State"]
