"""The fitted-noise distribution: per (layer, group) mean and std of final states, fitted before training."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn

from recurlen.models.state import LayeredState
from recurlen.training.interventions.noise_groups import NoiseGroups
from recurlen.training.stateful import Ranks
from recurlen.util.atomic_files import save_torch
from recurlen.util.errors import UserError


@dataclass
class FittedNoiseStats:
    """Per (layer, group) mean and std of final recurrent states: the fitted-noise distribution.

    The groups are the state type's (GROUP_DIMS): (layer, head) for Mamba-2 and GLA, layer for Mamba-1; or the
    finer ones `groups` says (intervention.fit_groups: blocks, decay), which are saved with the statistics.
    """

    mean_KH: torch.Tensor
    std_KH: torch.Tensor
    num_states: int = 0
    seq_len: int = 0
    groups: NoiseGroups = field(default_factory=NoiseGroups)

    def check(self, *, n_layer: int, nheads: int) -> None:
        for name, t in (("mean", self.mean_KH), ("std", self.std_KH)):
            if tuple(t.shape) != (n_layer, nheads):
                raise ValueError(f"fitted-noise {name} has shape {tuple(t.shape)}; this model needs "
                                 f"({n_layer}, {nheads}) (layers, heads or groups)")

    def check_state(self, zeros: LayeredState) -> None:
        """Check against a model's state type: (layers, groups) of its recurrent part."""
        part = noise_part(zeros)
        self.groups.check(zeros, part)
        k, g, _ = self.groups.view(zeros, part).shape
        self.check(n_layer=k, nheads=g)
        if not torch.isfinite(self.mean_KH).all() or not (self.std_KH >= 0).all():
            raise ValueError("fitted-noise statistics contain non-finite means or negative stds")

    def state_dict(self) -> dict:
        return {"mean_KH": self.mean_KH.cpu(), "std_KH": self.std_KH.cpu(), "num_states": self.num_states,
                "seq_len": self.seq_len, **self.groups.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        missing = {"mean_KH", "std_KH"} - set(state)
        if missing:
            raise ValueError(f"fitted-noise statistics are missing {sorted(missing)}")
        self.mean_KH, self.std_KH = state["mean_KH"].float(), state["std_KH"].float()
        self.num_states, self.seq_len = int(state.get("num_states", 0)), int(state.get("seq_len", 0))
        self.groups = NoiseGroups.from_state_dict(state)

    @classmethod
    def from_state_dict(cls, state: dict) -> FittedNoiseStats:
        stats = cls(torch.empty(0), torch.empty(0))
        stats.load_state_dict(state)
        return stats

    def save(self, path: str) -> None:
        save_torch(self.state_dict(), path)

    @classmethod
    def load(cls, path: str) -> FittedNoiseStats:
        """Read a file written by `save`; a damaged or foreign file is a one-line user error naming it."""
        from recurlen.util.errors import load_error

        if not Path(path).is_file():
            raise FileNotFoundError(f"fitted-noise statistics file {path!r} does not exist (write it with "
                                    "`recurlen fit-noise` or leave intervention.fit_stats empty to fit at start)")
        try:
            raw = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:
            raise load_error(path, err) from err
        if not isinstance(raw, dict) or not all(isinstance(raw.get(k), torch.Tensor) for k in ("mean_KH", "std_KH")):
            raise UserError(f"{path} is not a fitted-noise statistics file (it needs the tensors mean_KH and std_KH; "
                            "write it with `recurlen fit-noise`)")
        return cls.from_state_dict(raw)


def noise_part(state: LayeredState) -> str:
    """The recurrent part the noise interventions draw (every architecture has exactly one)."""
    if len(state.RECURRENT) != 1:
        raise ValueError(f"{type(state).__name__} has recurrent parts {list(state.RECURRENT)}; the noise "
                         "interventions support exactly one")
    return state.RECURRENT[0]


class Accumulator:
    """Running per (layer, group) sums over final states, for fitting the noise."""

    def __init__(self, groups: NoiseGroups | None = None) -> None:
        self.groups = groups or NoiseGroups()
        self.sum_KH: torch.Tensor | None = None
        self.sumsq_KH: torch.Tensor | None = None
        self.count = 0

    def add(self, state: LayeredState) -> None:
        x_KGM = self.groups.view(state, noise_part(state)).detach().double()
        s, sq = x_KGM.sum(dim=-1), x_KGM.pow(2).sum(dim=-1)
        self.sum_KH = s if self.sum_KH is None else self.sum_KH + s
        self.sumsq_KH = sq if self.sumsq_KH is None else self.sumsq_KH + sq
        self.count += x_KGM.shape[-1]

    def stats(self, *, num_states: int, seq_len: int) -> FittedNoiseStats:
        if self.sum_KH is None:
            raise ValueError("no final states were collected to fit the noise")
        mean = self.sum_KH / self.count
        var = (self.sumsq_KH / self.count - mean.pow(2)).clamp_min(0.0)
        return FittedNoiseStats(mean.float().cpu(), var.sqrt().float().cpu(), num_states, seq_len, self.groups)


@torch.no_grad()
def fit_noise_stats(model: nn.Module, batches: Iterable[dict], *, num_batches: int, seq_len: int,
                    ranks: Ranks | None = None, groups: NoiseGroups | None = None) -> FittedNoiseStats:
    """Per (layer, group) Gaussian of the final states of training sequences run from zeros (all ranks pooled;
    packed rows reset at each document start, so each row gives its last document's state); groups: the state
    type's own (default) or those of intervention.fit_groups (build_groups)."""
    ranks = ranks or Ranks()
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    acc = Accumulator(groups)
    sequences = 0
    try:
        for n, batch in enumerate(batches, start=1):
            # Packed rows (data.layout=packed) reset the state where a document starts, as training does: a row's
            # final state is then its last document's, never a state run across a document boundary.
            resets = batch.get("resets")
            _, final = model.forward_hidden(batch["input_ids"].to(device),
                                            **({} if resets is None else {"resets": resets.to(device)}))
            acc.add(final)
            sequences += batch["input_ids"].shape[0]
            if n >= num_batches:
                break
    finally:
        model.train(was_training)
    if acc.sum_KH is None:
        raise ValueError("fitting the noise got no training batches")
    if ranks.world_size > 1:
        packed = ranks.all_reduce_sum(torch.stack([acc.sum_KH, acc.sumsq_KH]).to(device))
        count = ranks.all_reduce_sum(torch.tensor(float(acc.count), device=device))
        acc.sum_KH, acc.sumsq_KH, acc.count = packed[0], packed[1], int(count.item())
    return acc.stats(num_states=sequences * ranks.world_size, seq_len=seq_len)
