"""Initial-state interventions: what state each lane starts from at each training step.

Ordered by how realistic the initial state is (Buitrago Ruiz & Gu, 2025):
  none            zeros (plain fine-tuning, the baseline)
  random_noise    i.i.d. N(0, std^2) on the SSM state, one std for all layers and heads
  fitted_noise    i.i.d. N(mean_kh, std_kh^2) per (layer, head), fitted on final states of training sequences
  state_passing   the lane's final state of the previous step (an unrelated sequence), detached
  tbptt           the same, but the lane's data continues its document stream (contiguous layout), so
                  this is truncated backprop through time: the state carries, the gradient stops

Noise and reset draws come from generators seeded by (seed, step, rank): a resumed run draws exactly
what the uninterrupted run drew, without saving any RNG state.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from recurlen.files import save_torch
from recurlen.layered_state import LayeredState

INTERVENTIONS = ("none", "random_noise", "fitted_noise", "state_passing", "tbptt")
LAYOUT_FOR = {"none": "independent", "random_noise": "independent", "fitted_noise": "independent",
              "state_passing": "independent", "tbptt": "contiguous"}


@dataclass
class InterventionConfig:
    name: str = "none"
    """One of none, random_noise, fitted_noise, state_passing, tbptt."""
    noise_std: float = 1.0
    """random_noise: std of the i.i.d. Gaussian (the paper gives none; ~ the state's scale early in a sequence)."""
    reset_prob: float = 0.1
    """state_passing / tbptt: per lane and step, the chance of starting from zeros instead of the carried state."""
    pass_conv: bool = False
    """state_passing / tbptt: carry the conv window too (exact continuation) or the SSM state only (paper)."""
    fit_batches: int = 8
    """fitted_noise: training batches whose final states the statistics are fitted on."""
    fit_stats: str | None = None
    """fitted_noise: a file written by `recurlen fit-noise`; None fits automatically at the start of training."""

    def __post_init__(self) -> None:
        if self.name not in INTERVENTIONS:
            raise ValueError(f"intervention.name={self.name!r} is unknown; allowed: {list(INTERVENTIONS)}")
        if not self.noise_std > 0:
            raise ValueError(f"intervention.noise_std must be > 0; got {self.noise_std}")
        if not 0.0 <= self.reset_prob <= 1.0:
            raise ValueError(f"intervention.reset_prob must be in [0, 1]; got {self.reset_prob}")
        if self.fit_batches < 1:
            raise ValueError(f"intervention.fit_batches must be >= 1; got {self.fit_batches}")

    @property
    def layout(self) -> str:
        return LAYOUT_FOR[self.name]


def step_generator(seed: int, step: int, rank: int, stream: int, device: torch.device) -> torch.Generator:
    """A generator that depends only on (seed, step, rank, stream): resume-exact randomness."""
    g = torch.Generator(device=device)
    g.manual_seed((seed * 1_000_003 + step * 7_919 + rank * 104_729 + stream * 15_485_863) % (2**63 - 1))
    return g


@dataclass
class FittedNoiseStats:
    """Per (layer, group) mean and std of final recurrent states: the fitted-noise distribution.

    The groups are the state type's (GROUP_DIMS): (layer, head) for Mamba-2 and GLA, layer for Mamba-1.
    """

    mean_KH: torch.Tensor
    std_KH: torch.Tensor
    num_states: int = 0
    seq_len: int = 0

    def check(self, *, n_layer: int, nheads: int) -> None:
        for name, t in (("mean", self.mean_KH), ("std", self.std_KH)):
            if tuple(t.shape) != (n_layer, nheads):
                raise ValueError(f"fitted-noise {name} has shape {tuple(t.shape)}; this model needs "
                                 f"({n_layer}, {nheads}) (layers, heads or groups)")

    def check_state(self, zeros: LayeredState) -> None:
        """Check against a model's state type: (layers, groups) of its recurrent part."""
        k, g, _ = zeros.group_view(noise_part(zeros)).shape
        self.check(n_layer=k, nheads=g)
        if not torch.isfinite(self.mean_KH).all() or not (self.std_KH >= 0).all():
            raise ValueError("fitted-noise statistics contain non-finite means or negative stds")

    def state_dict(self) -> dict:
        return {"mean_KH": self.mean_KH.cpu(), "std_KH": self.std_KH.cpu(), "num_states": self.num_states,
                "seq_len": self.seq_len}

    @classmethod
    def from_state_dict(cls, d: dict) -> FittedNoiseStats:
        missing = {"mean_KH", "std_KH"} - set(d)
        if missing:
            raise ValueError(f"fitted-noise statistics are missing {sorted(missing)}")
        return cls(d["mean_KH"].float(), d["std_KH"].float(), int(d.get("num_states", 0)), int(d.get("seq_len", 0)))

    def save(self, path: str) -> None:
        save_torch(self.state_dict(), path)

    @classmethod
    def load(cls, path: str) -> FittedNoiseStats:
        if not Path(path).is_file():
            raise FileNotFoundError(f"fitted-noise statistics file {path!r} does not exist (write it with "
                                    "`recurlen fit-noise` or leave intervention.fit_stats empty to fit at start)")
        return cls.from_state_dict(torch.load(path, map_location="cpu", weights_only=True))


def noise_part(state: LayeredState) -> str:
    """The recurrent part the noise interventions draw (every architecture has exactly one)."""
    if len(state.RECURRENT) != 1:
        raise ValueError(f"{type(state).__name__} has recurrent parts {list(state.RECURRENT)}; the noise "
                         "interventions support exactly one")
    return state.RECURRENT[0]


class Accumulator:
    """Running per (layer, group) sums over final states, for fitting the noise."""

    def __init__(self) -> None:
        self.sum_KH: torch.Tensor | None = None
        self.sumsq_KH: torch.Tensor | None = None
        self.count = 0

    def add(self, state: LayeredState) -> None:
        x_KGM = state.group_view(noise_part(state)).detach().double()
        s, sq = x_KGM.sum(dim=-1), x_KGM.pow(2).sum(dim=-1)
        self.sum_KH = s if self.sum_KH is None else self.sum_KH + s
        self.sumsq_KH = sq if self.sumsq_KH is None else self.sumsq_KH + sq
        self.count += x_KGM.shape[-1]

    def stats(self, *, num_states: int, seq_len: int) -> FittedNoiseStats:
        if self.sum_KH is None:
            raise ValueError("no final states were collected to fit the noise")
        mean = self.sum_KH / self.count
        var = (self.sumsq_KH / self.count - mean.pow(2)).clamp_min(0.0)
        return FittedNoiseStats(mean.float().cpu(), var.sqrt().float().cpu(), num_states, seq_len)


class Intervention:
    """Decides each lane's initial state. Stateless except for what the LightningModule carries."""

    def __init__(self, cfg: InterventionConfig, *, seed: int) -> None:
        self.cfg = cfg
        self.seed = seed

    @property
    def passes_state(self) -> bool:
        return self.cfg.name in ("state_passing", "tbptt")

    def initial_state(self, *, zeros: LayeredState, carried: LayeredState | None, new_stream_B: torch.Tensor,
                      step: int, rank: int, fitted: FittedNoiseStats | None) -> LayeredState:
        name, device = self.cfg.name, zeros.device
        if name == "none":
            return zeros
        if name in ("random_noise", "fitted_noise"):
            part = noise_part(zeros)
            shape = getattr(zeros, part).shape  # (K, B, *groups, *rest)
            g = step_generator(self.seed, step, rank, stream=1, device=device)
            eps = torch.randn(shape, generator=g, device=device, dtype=torch.float32)
            if name == "random_noise":
                noise = eps * self.cfg.noise_std
            else:
                if fitted is None:
                    raise ValueError("fitted_noise has no statistics; fit them first (`recurlen fit-noise`) or let "
                                     "training fit them at start")
                # (K, G) statistics broadcast over lanes and over the entries inside each group.
                groups = zeros.GROUP_DIMS.get(part, 0)
                view = (shape[0], 1, *shape[2:2 + groups], *([1] * (len(shape) - 2 - groups)))
                noise = fitted.mean_KH.to(device).view(view) + fitted.std_KH.to(device).view(view) * eps
            return zeros._map(lambda n, t: noise if n == part else t)
        # state_passing / tbptt
        if carried is None:
            return zeros
        state = carried.detach()  # the gradient stops at the step boundary
        if not self.cfg.pass_conv:
            state = state.recurrent_only()
        # In TBTT a lane whose stream restarts must not inherit the old stream's state. State passing
        # ignores stream boundaries on purpose: its previous batch is an unrelated sequence anyway.
        if self.cfg.name == "tbptt":
            reset_B = new_stream_B.to(device=device, dtype=torch.bool)
        else:
            reset_B = torch.zeros(zeros.batch_size, dtype=torch.bool, device=device)
        if self.cfg.reset_prob > 0:
            g = step_generator(self.seed, step, rank, stream=2, device=device)
            draw_B = torch.rand(zeros.batch_size, generator=g, device=device)
            reset_B = reset_B | (draw_B < self.cfg.reset_prob)
        return state.reset(reset_B)
