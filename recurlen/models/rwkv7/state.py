"""The recurrent state of an RWKV-7 language model.

Legend: K layers, B lanes, H heads, N head dim (key = value), D hidden size.

Per layer:
  wkv        the WKV matrix state S_t (H, N, N), key-major (fla's [N, H, K, V] layout; BlinkDL's code keeps its
             transpose), float32 always. It is the generalised delta rule S_t = (diag(w_t) + b_t a_t^T) S_t-1 +
             k_t v_t^T: it summarises the whole past and drifts with position. RECURRENT: the noise interventions
             draw it, fitted noise fits it per (layer, head), state passing and TBTT always carry it.
  att_shift  the time mix's token shift: the last token's normalised input (D,). A window of one token, like
             Mamba's conv window: no memory beyond the previous token, exactly what the first token of the next
             call mixes with, no drift. WINDOW.
  ffn_shift  the channel mix's token shift, the same for the second half of the block. WINDOW.

Not state: `v_first`, the first layer's value at the current token, which every later layer mixes into its own
value (the value residual). It is computed afresh for each token from that token's input and never outlives it
(it flows across layers, not across positions), so it travels with the hidden states through the block loop
(the LM's carry) and is not carried between calls.

Windows are carried by state passing only with `pass_conv` (as Mamba's conv windows are); zeroing them costs one
token of context at a segment boundary, as for RWKV-6.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from recurlen.models.state import LayeredState


@dataclass
class RWKV7State(LayeredState):
    wkv: torch.Tensor  # (K, B, H, N, N) float32, key-major
    att_shift: torch.Tensor  # (K, B, D)
    ffn_shift: torch.Tensor  # (K, B, D)

    RECURRENT: ClassVar[tuple[str, ...]] = ("wkv",)
    WINDOW: ClassVar[tuple[str, ...]] = ("att_shift", "ffn_shift")
    GROUP_DIMS: ClassVar[dict[str, int]] = {"wkv": 1}  # fitted noise per (layer, head)

    def __post_init__(self) -> None:
        if self.wkv.dim() != 5 or self.att_shift.dim() != 3 or self.ffn_shift.dim() != 3:
            raise ValueError("RWKV7State needs wkv (layers, batch, heads, head_dim, head_dim), att_shift and "
                             f"ffn_shift (layers, batch, hidden); got {tuple(self.wkv.shape)}, "
                             f"{tuple(self.att_shift.shape)} and {tuple(self.ffn_shift.shape)}")
        super().__post_init__()

    @classmethod
    def zeros_for(cls, config, batch: int, *, device: torch.device | str | None = None) -> RWKV7State:
        lead = (config.num_hidden_layers, batch)
        return cls(torch.zeros(*lead, config.num_heads, config.head_dim, config.head_dim, device=device),
                   torch.zeros(*lead, config.hidden_size, device=device),
                   torch.zeros(*lead, config.hidden_size, device=device))


__all__ = ["RWKV7State"]
