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

from recurlen.models.rwkv_common import RWKVState


@dataclass
class RWKV6State(RWKVState):
    """wkv (K, B, H, Dk, Dv) float32, att_shift and ffn_shift (K, B, D): RWKVState's parts and lane operations."""


__all__ = ["RWKV6State"]
