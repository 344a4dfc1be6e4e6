"""The recurrent state of a Mamba-3 language model: what mamba-ssm's Mamba-3 kernel carries between calls.

Legend: K layers, B lanes, H heads, P headdim, N d_state, S rotation angles per head.

Per layer:
  ssm    the SSM state h_t (H, P, N), float32 always. h_t = alpha_t h_t-1 + beta_t v_t-1 k_t-1^T + gamma_t v_t k_t^T
         with a data-dependent decay alpha_t: the recurrence, which summarises the whole past and drifts with
         position like Mamba-2's. RECURRENT: the noise interventions draw it, fitted noise fits it per (layer, head),
         state passing and TBTT always carry it.
  angle  the cumulative rotation angle theta_t (H, S), kept mod 2 pi: B and C are rotated by it (RoPE), so the
         state's key axis lives in the frame of theta_t. Only angle differences reach the outputs: rotating the
         angle, h's key pairs and k together is an exact symmetry, so a random angle is not new information for
         zero-mean noise on h. FRAME: carried with ssm wherever ssm is carried (ssm without its angle is
         read in the wrong coordinates: worse than a reset, docs/interventions.md), zero under the noise
         interventions, float32.
  k, v   the previous token's rotated key (H, N) and value (H, P), which the trapezoidal rule's beta term needs
         for the first token of the next call. A window of one token, like Mamba's conv window. WINDOW.

Windows are carried by state passing only with `pass_conv`; the split-invariance tests carry everything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from recurlen.models.state import LayeredState


@dataclass
class Mamba3State(LayeredState):
    ssm: torch.Tensor  # (K, B, H, P, N) float32
    angle: torch.Tensor  # (K, B, H, S)
    k: torch.Tensor  # (K, B, H, N)
    v: torch.Tensor  # (K, B, H, P)

    RECURRENT: ClassVar[tuple[str, ...]] = ("ssm",)
    FRAME: ClassVar[tuple[str, ...]] = ("angle",)
    WINDOW: ClassVar[tuple[str, ...]] = ("k", "v")
    GROUP_DIMS: ClassVar[dict[str, int]] = {"ssm": 1}  # fitted noise per (layer, head)

    def __post_init__(self) -> None:
        dims = {"ssm": 5, "angle": 4, "k": 4, "v": 4}
        wrong = {name: tuple(getattr(self, name).shape) for name, d in dims.items() if getattr(self, name).dim() != d}
        if wrong:
            raise ValueError("Mamba3State needs ssm (layers, batch, heads, headdim, d_state), angle (layers, batch, "
                             f"heads, angles), k (layers, batch, heads, d_state), v (layers, batch, heads, headdim); "
                             f"got {wrong}")
        super().__post_init__()

    @classmethod
    def zeros_for(cls, config, batch: int, *, device: torch.device | str | None = None) -> Mamba3State:
        lead = (config.n_layer, batch, config.nheads)
        return cls(torch.zeros(*lead, config.headdim, config.d_state, device=device),
                   torch.zeros(*lead, config.num_rope_angles, device=device),
                   torch.zeros(*lead, config.d_state, device=device),
                   torch.zeros(*lead, config.headdim, device=device))


__all__ = ["Mamba3State"]
