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

from recurlen.models.rwkv_common import RWKVState


@dataclass
class RWKV7State(RWKVState):
    """wkv (K, B, H, N, N) float32, key-major, att_shift and ffn_shift (K, B, D): RWKVState's parts and lane
    operations."""

    WKV_DIMS: ClassVar[str] = "head_dim, head_dim"


__all__ = ["RWKV7State"]
