"""Statistics of the recurrent state as a function of position (the paper's state-norm diagnostic).

Per layer and per sequence: the Frobenius norm and the standard deviation (over all entries) of
the recurrent state (Mamba-2's SSM state h (H, P, N), Mamba-1's (D, N), GLA's key-value state
(H, Dk, Dv): the state type's RECURRENT parts, reported under the names "ssm_*") and of the conv
windows (its WINDOW parts, "conv_*"; zero for a model without one), after s tokens have been read.
Curves are sums over sequences plus a count, so that ranks can add them up before taking the mean.

Legend: K layers, B batch rows, S sample positions, F statistics (STATE_STATS order).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from recurlen.models.state import LayeredState

STATE_STATS = ("ssm_norm", "ssm_std", "conv_norm", "conv_std")


def _norm_std(parts: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    # float64: norms of long-run states are summed over sequences and ranks before averaging.
    x_KBX = torch.cat([t.detach().to(torch.float64).flatten(2) for t in parts], dim=-1)
    if x_KBX.shape[-1] == 0:  # no conv window (e.g. GLA without short convs)
        zeros = x_KBX.new_zeros(x_KBX.shape[:2])
        return zeros, zeros
    return x_KBX.norm(dim=-1), x_KBX.std(dim=-1, correction=0)


def state_statistics(state: LayeredState) -> torch.Tensor:
    """(F, K, B) float64: norm / std of the recurrent state and of the conv windows, per layer and row."""
    ssm_norm, ssm_std = _norm_std([getattr(state, n) for n in state.RECURRENT])
    conv_norm, conv_std = _norm_std([getattr(state, n) for n in state.WINDOW] or
                                    [state._first.new_zeros(state.n_layer, state.batch_size, 0)])
    return torch.stack([ssm_norm, ssm_std, conv_norm, conv_std])


@dataclass
class StateCurves:
    """Sums over sequences of the state statistics at increasing positions."""

    positions: list[int]
    """Number of tokens read when the state was sampled (increasing, the last one is L)."""
    sums_FKS: torch.Tensor
    """(F, K, S) float64 sums over sequences; F follows STATE_STATS."""
    count: int
    """Number of sequences summed."""

    @classmethod
    def empty(cls, positions: Sequence[int], n_layer: int) -> StateCurves:
        return cls(list(positions), torch.zeros(len(STATE_STATS), n_layer, len(positions), dtype=torch.float64), 0)

    def means(self) -> dict[str, torch.Tensor]:
        """name -> (K, S) mean over sequences (NaN when nothing was counted)."""
        mean_FKS = self.sums_FKS / self.count if self.count else torch.full_like(self.sums_FKS, float("nan"))
        return {name: mean_FKS[i] for i, name in enumerate(STATE_STATS)}

    def to_dict(self) -> dict:
        """JSON-ready: {"positions": [S], "num_sequences": n, "<stat>": [[S] per layer]}."""
        out: dict = {"positions": list(self.positions), "num_sequences": self.count}
        out.update({name: curve_KS.tolist() for name, curve_KS in self.means().items()})
        return out
