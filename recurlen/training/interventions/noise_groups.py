"""The groups fitted noise fits one mean and std over (`intervention.fit_groups`), for every architecture.

  default  the state type's own groups (GROUP_DIMS): per (layer, head) where the state has heads, per
           layer for Mamba-1. Today's behaviour, bit for bit.
  blocks   per (layer, block): a layer's entries of the recurrent part, in the state's layout (lanes left out),
           cut into `count` equal blocks of consecutive entries (Mamba-1: blocks of d_inner channels with all
           their d_state entries, when count divides d_inner).
  decay    per (layer, decay quantile): a layer's entries sorted by their decay rate at zero input (the model's
           `state_decays()`; Mamba-1: softplus(dt bias) x |A| per (channel, state) entry), cut into `count` equal
           groups, slowest first. Only for architectures whose decays are parameters (Mamba-1, Mamba-2).

A finer grouping is a permutation per layer (`order_KE`: layer k's E entries in group order; group g is the
g-th of `count` equal slices of it), fixed when the statistics are first fitted (the decay rates move in training)
and saved with them: a refresh pools the final states over the same groups, and a resumed run or a run given
the statistics file draws from the same groups. A default grouping saves nothing new: its statistics files and
checkpoints are what they were.

Shapes: K layers, B lanes, E entries of a layer's recurrent part per lane, G groups per layer, M samples of a
group (over lanes and entries).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from recurlen.models.state import LayeredState
from recurlen.util.errors import UserError

FIT_GROUPS = ("default", "blocks", "decay")
DEFAULT_GROUP_COUNT = 8
"""Groups per layer for blocks / decay when intervention.fit_group_count is null."""


@dataclass
class NoiseGroups:
    """Which entries of a layer's recurrent part share one fitted mean and std."""

    kind: str = "default"
    order_KE: torch.Tensor | None = None
    """blocks / decay: layer k's entries (flattened, lanes left out) in group order; None for default."""
    count: int = 0
    """blocks / decay: groups per layer (equal slices of order_KE); 0 for default (the state type's groups)."""

    def __post_init__(self) -> None:
        if self.kind not in FIT_GROUPS:
            raise ValueError(f"fitted-noise groups {self.kind!r} are unknown; allowed: {list(FIT_GROUPS)}")
        if (self.kind == "default") != (self.order_KE is None):
            raise ValueError(f"fitted-noise groups {self.kind!r} need an entry order exactly when not default")
        if self.order_KE is not None:
            if self.order_KE.dim() != 2 or self.count < 1 or self.order_KE.shape[1] % self.count:
                raise ValueError(f"fitted-noise groups {self.kind!r}: an order of shape {tuple(self.order_KE.shape)} "
                                 f"cannot be cut into {self.count} equal groups per layer")
            self.order_KE = self.order_KE.long().cpu()

    @property
    def default(self) -> bool:
        return self.kind == "default"

    def describe(self) -> str:
        return "default" if self.default else f"{self.kind} ({self.count} per layer)"

    # ------------------------------------------------------------------ use
    def view(self, state: LayeredState, part: str) -> torch.Tensor:
        """The recurrent part as (K, G, M): the samples of each group, over lanes and entries."""
        if self.order_KE is None:
            return state.group_view(part)
        t = getattr(state, part)
        k, b = t.shape[:2]
        flat = t.reshape(k, b, -1)
        order = self.order_KE.to(t.device).unsqueeze(1).expand(k, b, -1)
        grouped = flat.gather(2, order).view(k, b, self.count, -1)  # (K, B, G, E/G)
        return grouped.transpose(1, 2).reshape(k, self.count, -1)

    def per_entry(self, values_KG: torch.Tensor, like: torch.Tensor, groups_dims: int) -> torch.Tensor:
        """Per-group values (K, G) broadcast to a part shaped `like` (K, B, *entries): each entry its group's value.
        groups_dims: the state type's GROUP_DIMS for the part (what the default groups are)."""
        shape = like.shape
        values = values_KG.to(like.device)
        if self.order_KE is None:  # (K, G) over lanes and over the entries inside each group
            return values.view(shape[0], 1, *shape[2:2 + groups_dims], *([1] * (len(shape) - 2 - groups_dims)))
        order = self.order_KE.to(like.device)
        sorted_KE = values.repeat_interleave(order.shape[1] // self.count, dim=1)
        return torch.empty_like(sorted_KE).scatter_(1, order, sorted_KE).view(shape[0], 1, *shape[2:])

    def check(self, zeros: LayeredState, part: str) -> None:
        """Fits a model whose zero state is `zeros`: one order entry per layer and entry, a permutation each."""
        if self.order_KE is None:
            return
        t = getattr(zeros, part)
        want = (t.shape[0], t[0, 0].numel())
        if tuple(self.order_KE.shape) != want:
            raise ValueError(f"fitted-noise groups {self.kind!r} order {tuple(self.order_KE.shape)} entries; this "
                             f"model needs {want} (layers, entries of a layer's {part})")
        if not torch.equal(self.order_KE.sort(dim=1).values, torch.arange(want[1]).expand(*want)):
            raise ValueError(f"fitted-noise groups {self.kind!r}: the entry order is not a permutation per layer")

    # ------------------------------------------------------------------ files
    def state_dict(self) -> dict:
        """What the statistics save besides mean and std: nothing for the default groups."""
        if self.order_KE is None:
            return {}
        return {"groups": self.kind, "group_count": self.count, "order_KE": self.order_KE.cpu()}

    @classmethod
    def from_state_dict(cls, state: dict) -> NoiseGroups:
        kind = state.get("groups", "default")
        if kind == "default":
            return cls()
        order = state.get("order_KE")
        if not isinstance(order, torch.Tensor):
            raise ValueError(f"fitted-noise statistics grouped {kind!r} lack their entry order (order_KE)")
        return cls(kind, order, int(state.get("group_count", 0)))


def build_groups(kind: str, count: int | None, *, zeros: LayeredState, part: str,
                 model: nn.Module | None = None) -> NoiseGroups:
    """The grouping intervention.fit_groups / fit_group_count ask for, on a model whose zero state is `zeros`
    (decay reads the model's decay rates now). A grouping the model cannot have is a one-line user error."""
    if kind == "default":
        return NoiseGroups()
    t = getattr(zeros, part)
    k, entries = t.shape[0], t[0, 0].numel()
    count = DEFAULT_GROUP_COUNT if count is None else count
    if count < 1 or entries % count:
        some = [d for d in range(1, min(entries, 64) + 1) if entries % d == 0]
        raise UserError(f"intervention.fit_group_count={count} does not divide the {entries} entries of a layer's "
                        f"{part} state {tuple(t.shape[2:])}; allowed here: a divisor of {entries}, e.g. {some}")
    if kind == "blocks":
        return NoiseGroups(kind, torch.arange(entries).expand(k, entries).clone(), count)
    rates = (getattr(model, "state_decays", lambda: {})() if model is not None else {}).get(part)
    if rates is None:
        raise UserError(f"intervention.fit_groups=decay needs decay rates that are parameters; this model's "
                        f"({type(model).__name__}) depend on the input; allowed for it: default, blocks")
    rates_KE = rates.detach().float().cpu().reshape(k, -1)
    if rates_KE.shape[1] != entries:
        raise ValueError(f"{type(model).__name__}.state_decays()[{part!r}] has {rates_KE.shape[1]} entries per "
                         f"layer; its state has {entries}")
    return NoiseGroups(kind, torch.argsort(rates_KE, dim=1, stable=True), count)


__all__ = ["DEFAULT_GROUP_COUNT", "FIT_GROUPS", "NoiseGroups", "build_groups"]
