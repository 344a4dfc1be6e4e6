"""Statistics of the recurrent state as a function of position (the paper's state-norm diagnostic).

Per layer and per sequence: the Frobenius norm and the standard deviation (over all entries) of
the SSM state h (H, P, N) and of the conv window (C, W), after s tokens have been read. Curves
are sums over sequences plus a count, so that ranks can add them up before taking the mean.

Legend: K layers, B batch rows, S sample positions, F statistics (STATE_STATS order).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from recurlen.state import RecurrentState

STATE_STATS = ("ssm_norm", "ssm_std", "conv_norm", "conv_std")


def state_statistics(state: RecurrentState) -> torch.Tensor:
    """(F, K, B) float64: norm / std of the SSM state and of the conv window, per layer and row."""
    # float64: norms of long-run states are summed over sequences and ranks before averaging.
    ssm_KBX = state.ssm.detach().to(torch.float64).flatten(2)
    conv_KBX = state.conv.detach().to(torch.float64).flatten(2)
    return torch.stack([
        ssm_KBX.norm(dim=-1), ssm_KBX.std(dim=-1, correction=0),
        conv_KBX.norm(dim=-1), conv_KBX.std(dim=-1, correction=0),
    ])


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
