"""The recurrent state of a Mamba-2 language model, as a type.

Shape legend (used in names across recurlen):
  K  layers            B  batch rows (lanes)    H  SSM heads       P  head dim
  N  SSM state size    C  conv channels         W  conv window (d_conv - 1)

`ssm_KBHPN` is the SSD state h_t of every layer, float32 always: it accumulates over
arbitrarily many tokens and is the quantity the paper's diagnostics look at.
`conv_KBCW` holds the last W *inputs* of the depthwise causal conv of every layer
(the conv is the only other thing that remembers the past), in the model's dtype.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class RecurrentState:
    ssm: torch.Tensor  # (K, B, H, P, N) float32
    conv: torch.Tensor  # (K, B, C, W)

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

    @classmethod
    def cat(cls, states: Sequence[RecurrentState]) -> RecurrentState:
        """Concatenate along the batch (lane) dimension, e.g. to gather lanes of several ranks."""
        if not states:
            raise ValueError("RecurrentState.cat needs at least one state")
        return cls(torch.cat([s.ssm for s in states], dim=1), torch.cat([s.conv for s in states], dim=1))

    # ------------------------------------------------------------------ shape
    @property
    def n_layer(self) -> int:
        return self.ssm.shape[0]

    @property
    def batch_size(self) -> int:
        return self.ssm.shape[1]

    @property
    def device(self) -> torch.device:
        return self.ssm.device

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.ssm[i], self.conv[i]

    # ------------------------------------------------------------------ transforms
    def detach(self) -> RecurrentState:
        """Cut the graph: what truncated BPTT / state passing do between steps."""
        return RecurrentState(self.ssm.detach(), self.conv.detach())

    def clone(self) -> RecurrentState:
        return RecurrentState(self.ssm.clone(), self.conv.clone())

    def to(self, device: torch.device | str | None = None, *, conv_dtype: torch.dtype | None = None) -> RecurrentState:
        return RecurrentState(self.ssm.to(device=device), self.conv.to(device=device, dtype=conv_dtype))

    def __getitem__(self, rows) -> RecurrentState:
        """Select batch rows (an int, slice, index tensor or boolean mask over lanes)."""
        if isinstance(rows, int):
            rows = slice(rows, rows + 1)
        return RecurrentState(self.ssm[:, rows], self.conv[:, rows])

    def where(self, keep_B: torch.Tensor, other: RecurrentState) -> RecurrentState:
        """Per lane: keep this state where keep_B is True, else take `other` (out of place, autograd-safe)."""
        keep_B = keep_B.to(device=self.device, dtype=torch.bool)
        if keep_B.shape != (self.batch_size,):
            raise ValueError(f"mask must have shape ({self.batch_size},); got {tuple(keep_B.shape)}")
        ssm = torch.where(keep_B.view(1, -1, 1, 1, 1), self.ssm, other.ssm.to(self.ssm.dtype))
        conv = torch.where(keep_B.view(1, -1, 1, 1), self.conv, other.conv.to(self.conv.dtype))
        return RecurrentState(ssm, conv)

    def reset(self, reset_B: torch.Tensor) -> RecurrentState:
        """Zero the lanes where reset_B is True (out of place)."""
        return self.where(~reset_B.to(device=self.device, dtype=torch.bool), self.zeros_like())

    def zeros_like(self) -> RecurrentState:
        return RecurrentState(torch.zeros_like(self.ssm), torch.zeros_like(self.conv))

    def with_ssm_only(self) -> RecurrentState:
        """The SSM state with the conv window zeroed: what the paper's pseudocode passes."""
        return RecurrentState(self.ssm, torch.zeros_like(self.conv))

    # ------------------------------------------------------------------ checks / io
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

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"ssm": self.ssm.detach().cpu(), "conv": self.conv.detach().cpu()}

    @classmethod
    def from_state_dict(cls, d: dict[str, torch.Tensor]) -> RecurrentState:
        missing = {"ssm", "conv"} - set(d)
        if missing:
            raise ValueError(f"a saved RecurrentState needs keys 'ssm' and 'conv'; missing {sorted(missing)}")
        return cls(d["ssm"].float(), d["conv"])

    def norms(self) -> dict[str, torch.Tensor]:
        """Per-layer RMS over everything but the layer dim: cheap summaries for logging."""
        ssm = self.ssm.detach().float()
        conv = self.conv.detach().float()
        return {
            "ssm_rms_K": ssm.pow(2).mean(dim=(1, 2, 3, 4)).sqrt(),
            "conv_rms_K": conv.pow(2).mean(dim=(1, 2, 3)).sqrt(),
        }
