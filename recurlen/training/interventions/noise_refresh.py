"""Fitted noise "during training": the statistics follow the final states that training produces.

The fitted-noise intervention starts from statistics fitted once, on zero-start final states of the initial
model. With a refresh they are updated from the final states seen in training (which, under fitted noise,
started from the noise itself, so the distribution moves towards the states of longer contexts):

  window     the final states of `every` consecutive steps, pooled per (layer, group) as first and second
             moments (sum, sum of squares, count) in float64; under DDP the window is summed over ranks
  every      at the end of each window the moments become the window's
  ema        at the end of each window moments <- decay x moments + (1 - decay) x window's

The mean and std the noise is drawn from are the moments' mean and sqrt(second moment - mean^2). The moments
(not the float32 mean / std) are the state, kept in float64, so that ema blends what it blended before; they
and the part of the window seen so far (per rank) go into checkpoints, so a resumed run refreshes exactly as
an uninterrupted one.

Shapes: K layers, G groups (heads), M entries of a group over the lanes of a batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from recurlen.training.stateful import Ranks

REFRESH_MODES = ("none", "every", "ema")


@dataclass
class Moments:
    """First and second moments per (layer, group), float64."""

    mean_KG: torch.Tensor
    m2_KG: torch.Tensor

    @classmethod
    def of_gaussian(cls, mean_KG: torch.Tensor, std_KG: torch.Tensor) -> Moments:
        mean = mean_KG.double()
        return cls(mean, std_KG.double().pow(2) + mean.pow(2))

    def mean_std(self) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 mean and std on the CPU (the noise's parameters)."""
        var = (self.m2_KG - self.mean_KG.pow(2)).clamp_min(0.0)
        return self.mean_KG.float().cpu(), var.sqrt().float().cpu()

    def blend(self, new: Moments, decay: float) -> Moments:
        return Moments(decay * self.mean_KG + (1.0 - decay) * new.mean_KG,
                       decay * self.m2_KG + (1.0 - decay) * new.m2_KG)


class StatsRefresh:
    """The window of final states and the moments it updates (see the module docstring); every rank pools its
    window with the others' through `ranks`."""

    def __init__(self, mode: str, *, every: int, decay: float, ranks: Ranks | None = None) -> None:
        if mode not in REFRESH_MODES[1:]:
            raise ValueError(f"fit_refresh={mode!r} has no refresh; allowed: {list(REFRESH_MODES)}")
        self.mode, self.every, self.decay = mode, every, decay
        self.ranks = ranks or Ranks()
        self.device = torch.device("cpu")
        """Where the last final states were (checkpoint gathers run there: NCCL needs CUDA tensors)."""
        self.moments: Moments | None = None
        self.sum_KG: torch.Tensor | None = None
        self.sumsq_KG: torch.Tensor | None = None
        self.count = 0
        """Entries in the open window (this rank)."""
        self.lanes_in_window = 0
        """Final states (lanes) in the open window (this rank)."""
        self.refreshes = 0
        self.states_seen = 0
        """Final states (lanes x ranks) that went into refreshes so far."""

    def start(self, mean_KG: torch.Tensor, std_KG: torch.Tensor) -> None:
        """Begin from the statistics fitted before training (unless a checkpoint already restored moments)."""
        if self.moments is None:
            self.moments = Moments.of_gaussian(mean_KG, std_KG)

    def add(self, x_KGM: torch.Tensor, lanes: int) -> None:
        """One step's final states, grouped: entries of a group over all of this rank's lanes."""
        self.device = x_KGM.device
        x = x_KGM.detach().double()
        s, sq = x.sum(dim=-1), x.pow(2).sum(dim=-1)
        if self.sum_KG is None:
            self.sum_KG, self.sumsq_KG = s, sq
        else:  # a window restored from a checkpoint sits on the CPU until the first step after resume
            self.sum_KG = self.sum_KG.to(s.device) + s
            self.sumsq_KG = self.sumsq_KG.to(s.device) + sq
        self.count += x.shape[-1]
        self.lanes_in_window += lanes

    def due(self, step: int) -> bool:
        """Whether step (0-based) ends a window."""
        return (step + 1) % self.every == 0

    def refresh(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Fold the window into the moments (every rank at the same step); returns the new (mean, std)."""
        assert self.moments is not None and self.sum_KG is not None, "refresh before start() or without states"
        k, g = self.sum_KG.shape
        # One collective for the whole window: sums, sums of squares, entry count and lane count.
        packed = torch.cat([self.sum_KG.flatten(), self.sumsq_KG.flatten(),
                            torch.tensor([float(self.count), float(self.lanes_in_window)], dtype=torch.float64,
                                         device=self.sum_KG.device)])
        if self.ranks.world_size > 1:
            packed = self.ranks.all_reduce_sum(packed)
        total, lanes = packed[-2], packed[-1]
        window = Moments((packed[:k * g] / total).view(k, g), (packed[k * g:2 * k * g] / total).view(k, g))
        if self.mode == "every":
            self.moments = window
        else:
            old = Moments(self.moments.mean_KG.to(window.mean_KG.device), self.moments.m2_KG.to(window.m2_KG.device))
            self.moments = old.blend(window, self.decay)
        self.sum_KG, self.sumsq_KG, self.count, self.lanes_in_window = None, None, 0, 0
        self.refreshes += 1
        self.states_seen += int(lanes.item())
        return self.moments.mean_std()

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """The moments and every rank's part of the open window (every rank must call this: it gathers, on the
        device of the last final states)."""
        assert self.moments is not None
        gather, world_size, device = self.ranks.all_gather, self.ranks.world_size, self.device
        n = self.moments.mean_KG.numel()
        sums = (torch.zeros(2 * n, dtype=torch.float64) if self.sum_KG is None
                else torch.cat([self.sum_KG.flatten(), self.sumsq_KG.flatten()]))
        window = torch.cat([sums.to(device), torch.tensor([float(self.count), float(self.lanes_in_window)],
                                                          dtype=torch.float64, device=device)])
        windows = gather(window).view(world_size, -1) if world_size > 1 and gather is not None else window.view(1, -1)
        return {"mode": self.mode, "mean_KG": self.moments.mean_KG.cpu(), "m2_KG": self.moments.m2_KG.cpu(),
                "windows": windows.cpu(), "world_size": world_size, "refreshes": self.refreshes,
                "states_seen": self.states_seen}

    def load_state_dict(self, state: dict) -> None:
        """Take back the moments and this rank's part of the open window. On another world size the ranks'
        parts cannot be mapped; rank 0 takes their sum (the next refresh pools them all anyway)."""
        rank, world_size = self.ranks.rank, self.ranks.world_size
        self.moments = Moments(state["mean_KG"].double(), state["m2_KG"].double())
        self.refreshes, self.states_seen = int(state["refreshes"]), int(state["states_seen"])
        windows = state["windows"].double()
        if int(state["world_size"]) == world_size:
            row = windows[rank]
        else:
            row = windows.sum(dim=0) if rank == 0 else torch.zeros_like(windows[0])
        n = self.moments.mean_KG.numel()
        self.count, self.lanes_in_window = int(row[-2].item()), int(row[-1].item())
        if self.count == 0:
            self.sum_KG, self.sumsq_KG = None, None
        else:
            shape = self.moments.mean_KG.shape
            self.sum_KG, self.sumsq_KG = row[:n].view(shape).clone(), row[n:2 * n].view(shape).clone()
