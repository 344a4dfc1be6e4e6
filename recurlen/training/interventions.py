"""Initial-state interventions: what state each lane starts from at each training step.

Ordered by how realistic the initial state is (Buitrago Ruiz & Gu, 2025):
  none            zeros (plain fine-tuning, the baseline)
  random_noise    i.i.d. N(0, std^2) on the SSM state, one std for all layers and heads
  fitted_noise    i.i.d. N(mean_kh, std_kh^2) per (layer, head), fitted on final states of training sequences
  state_passing   the lane's final state of the previous step (an unrelated sequence), detached
  tbptt           truncated backprop through time as the paper defines it: a long sequence is
                  tbptt_segments consecutive segments of T tokens of the lane's contiguous stream, run from a
                  zero state with the state carried and the gradient stopped between segments; then a fresh
                  long sequence (the lane's next tokens) starts from zeros again

Noise and reset draws come from generators seeded by (seed, step, rank): a resumed run draws exactly
what the uninterrupted run drew, without saving any RNG state.
Each intervention owns what it remembers between steps (carried lane states, fitted statistics) and
saves it into the checkpoint itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
from lightning.pytorch.utilities import rank_zero_warn

from recurlen.models.state import LayeredState
from recurlen.training.noise_refresh import REFRESH_MODES, StatsRefresh
from recurlen.util.atomic_files import save_torch
from recurlen.util.errors import UserError

log = logging.getLogger(__name__)

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
    """state_passing / tbptt: per lane and step, the chance of starting from zeros instead of the carried state
    (recurlen's choice for state_passing; the paper's TBTT has no random resets, so tbptt.yaml sets 0)."""
    tbptt_segments: int | None = 8
    """tbptt: segments of T tokens per long sequence; the state restarts from zeros at every step that is a
    multiple of it (a fresh long sequence of tbptt_segments x T tokens). None: one endless sequence per lane."""
    pass_conv: bool = False
    """state_passing / tbptt: carry the conv window too (exact continuation) or the SSM state only (paper)."""
    fit_batches: int = 8
    """fitted_noise: training batches whose final states the statistics are fitted on."""
    fit_stats: str | None = None
    """fitted_noise: a file written by `recurlen fit-noise`; None fits automatically at the start of training."""
    fit_refresh: str = "none"
    """fitted_noise: none keeps the statistics fitted before training; every / ema update them from the final
    states seen in training (all ranks), at the end of every fit_refresh_every steps: every replaces them by
    those steps' statistics, ema blends those in (moments <- fit_ema x old + (1 - fit_ema) x new)."""
    fit_refresh_every: int = 10
    """fitted_noise with fit_refresh: training batches per refresh, whose final states one refresh pools (the
    data's steps: micro-batches under gradient accumulation, so every rank refreshes at the same batch)."""
    fit_ema: float = 0.9
    """fitted_noise with fit_refresh=ema: the weight the old moments keep at each refresh, in [0, 1)."""

    def __post_init__(self) -> None:
        if self.name not in INTERVENTIONS:
            raise ValueError(f"intervention.name={self.name!r} is unknown; allowed: {list(INTERVENTIONS)}")
        if not self.noise_std > 0:
            raise ValueError(f"intervention.noise_std must be > 0; got {self.noise_std}")
        if not 0.0 <= self.reset_prob <= 1.0:
            raise ValueError(f"intervention.reset_prob must be in [0, 1]; got {self.reset_prob}")
        if self.tbptt_segments is not None and (isinstance(self.tbptt_segments, bool)
                                                or not isinstance(self.tbptt_segments, int) or self.tbptt_segments < 1):
            raise ValueError(f"intervention.tbptt_segments={self.tbptt_segments!r} is not allowed; need an integer "
                             ">= 1 (segments per long sequence) or null (one endless sequence per lane)")
        if self.fit_batches < 1:
            raise ValueError(f"intervention.fit_batches must be >= 1; got {self.fit_batches}")
        if self.fit_refresh not in REFRESH_MODES:
            raise ValueError(f"intervention.fit_refresh={self.fit_refresh!r} is unknown; "
                             f"allowed: {list(REFRESH_MODES)}")
        if self.fit_refresh_every < 1:
            raise ValueError(f"intervention.fit_refresh_every must be >= 1; got {self.fit_refresh_every}")
        if not 0.0 <= self.fit_ema < 1.0:
            raise ValueError(f"intervention.fit_ema must be in [0, 1); got {self.fit_ema}")

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


@dataclass
class Ranks:
    """How an intervention reaches the other ranks of a run (a single process: rank 0 of 1, no communication)."""

    rank: int = 0
    world_size: int = 1
    all_gather: Callable[[torch.Tensor], torch.Tensor] | None = None
    """tensor -> (world_size, *tensor.shape), every rank's tensor; called on every rank at once."""
    all_reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None
    """tensor -> the sum of every rank's tensor; called on every rank at once."""


class Intervention:
    """Decides each lane's initial state at each step, and owns whatever it remembers between steps.

    The LightningModule calls, in a run:
      setup(...)           once before the first step (fitted noise fits or loads its statistics)
      initial_state(...)   each step: the state every lane of the batch starts from
      observe(...)         each step: the batch's final states (state passing keeps them; fitted noise with
                           a refresh pools them, all ranks together at the end of a refresh window)
      scalars()            what to log each step (e.g. the refreshed noise's scale)
      state_dict(ranks) / load_state_dict(d, ranks)   into / out of every checkpoint, all ranks together
    """

    passes_state = False
    """True when the final states of one step become the next step's initial states."""

    def __init__(self, cfg: InterventionConfig, *, seed: int, zero_state: LayeredState) -> None:
        self.cfg = cfg
        self.seed = seed
        self.zero_state = zero_state
        """A one-lane zero state of the model (on the CPU): its state type, parts and groups."""

    @property
    def name(self) -> str:
        return self.cfg.name

    def setup(self, model: nn.Module, batches: Callable[[int], dict], *, ranks: Ranks, seq_len: int) -> None:
        """Before the first training step; `batches(step)` gives the training batch of a step."""

    def initial_state(self, *, zeros: LayeredState, lanes_B: torch.Tensor, new_stream_B: torch.Tensor, step: int,
                      rank: int) -> LayeredState:
        return zeros

    def observe(self, final: LayeredState, lanes_B: torch.Tensor, *, step: int, ranks: Ranks) -> None:
        """The final states of the step's lanes (with their autograd graph; keep only detached copies).
        Every rank calls it at every step, so it may use the ranks' collectives."""

    def scalars(self) -> dict[str, float]:
        """Values to log under train/ after each step."""
        return {}

    def state_dict(self, ranks: Ranks) -> dict:
        return {}

    def load_state_dict(self, state: dict, ranks: Ranks) -> None:
        """Restore from state_dict(); every rank takes back what belongs to it."""


class RandomNoise(Intervention):
    """i.i.d. N(0, noise_std^2) on the state's recurrent part; the other parts (conv windows) start from zeros."""

    def noise(self, eps: torch.Tensor, zeros: LayeredState, part: str) -> torch.Tensor:
        return eps * self.cfg.noise_std

    def initial_state(self, *, zeros: LayeredState, lanes_B: torch.Tensor, new_stream_B: torch.Tensor, step: int,
                      rank: int) -> LayeredState:
        device, part = zeros.device, noise_part(zeros)
        g = step_generator(self.seed, step, rank, stream=1, device=device)
        eps = torch.randn(getattr(zeros, part).shape, generator=g, device=device, dtype=torch.float32)
        noise = self.noise(eps, zeros, part)
        return zeros._map(lambda n, t: noise if n == part else t)


class FittedNoise(RandomNoise):
    """N(mean, std^2) per (layer, group) of the state type (Mamba-2 / GLA: head, Mamba-1: layer), fitted on
    the final states of training sequences run from zeros; with fit_refresh, updated from the final states
    seen in training (recurlen.training.noise_refresh)."""

    def __init__(self, cfg: InterventionConfig, *, seed: int, zero_state: LayeredState) -> None:
        super().__init__(cfg, seed=seed, zero_state=zero_state)
        self.stats: FittedNoiseStats | None = None
        self.refresh = None if cfg.fit_refresh == "none" else StatsRefresh(
            cfg.fit_refresh, every=cfg.fit_refresh_every, decay=cfg.fit_ema)
        self.device = torch.device("cpu")
        """Where the last final states were (checkpoint gathers run there: NCCL needs CUDA tensors)."""

    def set_stats(self, stats: FittedNoiseStats) -> None:
        stats.check_state(self.zero_state)
        self.stats = stats

    def load_stats_file(self) -> None:
        """Load intervention.fit_stats and check it fits this model: a damaged file or the statistics of another
        model are a one-line user error naming the file (run_finetune checks this before anything is written)."""
        try:
            self.set_stats(FittedNoiseStats.load(self.cfg.fit_stats))
        except UserError:
            raise
        except ValueError as err:  # statistics of another model (shape) or broken values
            raise UserError(f"intervention.fit_stats={self.cfg.fit_stats}: {err}; fit them again for this model "
                            "with `recurlen fit-noise`") from err

    def setup(self, model: nn.Module, batches: Callable[[int], dict], *, ranks: Ranks, seq_len: int) -> None:
        if self.stats is None:  # else restored from a checkpoint
            self.set_stats(self._initial_stats(model, batches, ranks=ranks, seq_len=seq_len))
        if self.refresh is not None:  # starts from these unless the checkpoint restored the refresh's moments
            self.refresh.start(self.stats.mean_KH, self.stats.std_KH)

    def _initial_stats(self, model: nn.Module, batches: Callable[[int], dict], *, ranks: Ranks,
                       seq_len: int) -> FittedNoiseStats:
        if self.cfg.fit_stats:
            self.load_stats_file()  # checked against this model: a user error names the file
            return self.stats
        n = self.cfg.fit_batches
        stats = fit_noise_stats(model, (batches(step) for step in range(n)), num_batches=n, seq_len=seq_len,
                                ranks=ranks)
        log.info("fitted noise on the final states of %d sequences: mean |mu| %.3g, mean sigma %.3g", stats.num_states,
                 stats.mean_KH.abs().mean().item(), stats.std_KH.mean().item())
        return stats

    def observe(self, final: LayeredState, lanes_B: torch.Tensor, *, step: int, ranks: Ranks) -> None:
        if self.refresh is None:
            return
        part = noise_part(final)
        self.device = getattr(final, part).device
        self.refresh.add(final.group_view(part), lanes=int(lanes_B.shape[0]))
        if self.refresh.due(step):
            mean, std = self.refresh.refresh(ranks.all_reduce_sum if ranks.world_size > 1 else None)
            assert self.stats is not None
            self.stats = FittedNoiseStats(mean, std, num_states=self.refresh.states_seen, seq_len=self.stats.seq_len)

    def scalars(self) -> dict[str, float]:
        if self.refresh is None or self.stats is None:
            return {}
        return {"fitted_noise_std": self.stats.std_KH.mean().item(),
                "fitted_noise_abs_mean": self.stats.mean_KH.abs().mean().item()}

    def noise(self, eps: torch.Tensor, zeros: LayeredState, part: str) -> torch.Tensor:
        if self.stats is None:
            raise ValueError("fitted_noise has no statistics; fit them first (`recurlen fit-noise`) or let "
                             "training fit them at start")
        # (K, G) statistics broadcast over lanes and over the entries inside each group.
        shape, groups = eps.shape, zeros.GROUP_DIMS.get(part, 0)
        view = (shape[0], 1, *shape[2:2 + groups], *([1] * (len(shape) - 2 - groups)))
        return self.stats.mean_KH.to(eps.device).view(view) + self.stats.std_KH.to(eps.device).view(view) * eps

    def state_dict(self, ranks: Ranks) -> dict:
        """The statistics; with a refresh also its moments and every rank's open window (all ranks call this)."""
        state = {"fitted_noise": None if self.stats is None else self.stats.state_dict()}
        if self.refresh is not None and self.refresh.moments is not None:
            state["fitted_noise_refresh"] = self.refresh.state_dict(ranks.all_gather, ranks.world_size,
                                                                    device=self.device)
        return state

    def load_state_dict(self, state: dict, ranks: Ranks) -> None:
        if state.get("fitted_noise") is not None:
            self.set_stats(FittedNoiseStats.from_state_dict(state["fitted_noise"]))
        # A checkpoint without a refresh (or a run that turned it on later) starts refreshing from the restored
        # statistics in setup(); one with a refresh but a run without keeps the statistics as they were.
        saved = state.get("fitted_noise_refresh")
        if self.refresh is not None and saved is not None:
            if saved["mode"] != self.refresh.mode:
                rank_zero_warn(f"the checkpoint's fitted-noise refresh was {saved['mode']!r}, this run's is "
                               f"{self.refresh.mode!r}: it continues from the saved moments with the new rule")
            self.refresh.load_state_dict(saved, rank=ranks.rank, world_size=ranks.world_size)


class StatePassing(Intervention):
    """Each lane starts from its own final state of the previous step, detached (the gradient stops there).

    state_passing: the lane's previous batch is an unrelated sequence, so stream boundaries are ignored.
    tbptt: the lane's data continues its document (contiguous layout), so this is truncated backprop
    through time; a lane whose stream restarts starts from zeros.
    The carried states live on this rank (plain tensors, not buffers: DDP must not broadcast them, each
    rank owns other lanes); checkpoints gather every rank's lanes and each rank takes its own back.
    """

    passes_state = True

    def __init__(self, cfg: InterventionConfig, *, seed: int, zero_state: LayeredState) -> None:
        super().__init__(cfg, seed=seed, zero_state=zero_state)
        self.carried: LayeredState | None = None
        self.carried_lanes: torch.Tensor | None = None

    def starts_long_sequence(self, step: int) -> bool:
        """tbptt: whether segment `step` of every lane is the first of a long sequence (zero state)."""
        k = self.cfg.tbptt_segments
        return self.cfg.name == "tbptt" and (step == 0 or (k is not None and step % k == 0))

    def initial_state(self, *, zeros: LayeredState, lanes_B: torch.Tensor, new_stream_B: torch.Tensor, step: int,
                      rank: int) -> LayeredState:
        device = zeros.device
        if self.carried is None:
            return zeros
        if self.carried.device != device:  # restored from a checkpoint before the model moved
            self.carried = self.carried.to(device)
        assert self.carried_lanes is not None and torch.equal(self.carried_lanes, lanes_B.cpu()), \
            "carried states belong to other lanes than this batch's"
        state = self.carried.detach()  # the gradient stops at the step boundary
        if not self.cfg.pass_conv:
            state = state.recurrent_only()
        # In TBTT a lane whose stream restarts, or whose long sequence ends, must not inherit the old state.
        # State passing ignores stream boundaries on purpose: its previous batch is an unrelated sequence anyway.
        if self.cfg.name == "tbptt":
            reset_B = new_stream_B.to(device=device, dtype=torch.bool)
            if self.starts_long_sequence(step):
                reset_B = torch.ones_like(reset_B)
        else:
            reset_B = torch.zeros(zeros.batch_size, dtype=torch.bool, device=device)
        if self.cfg.reset_prob > 0:
            g = step_generator(self.seed, step, rank, stream=2, device=device)
            draw_B = torch.rand(zeros.batch_size, generator=g, device=device)
            reset_B = reset_B | (draw_B < self.cfg.reset_prob)
        return state.reset(reset_B)

    def observe(self, final: LayeredState, lanes_B: torch.Tensor, *, step: int, ranks: Ranks) -> None:
        self.carried = final.detach()
        self.carried_lanes = lanes_B.detach().cpu()

    def state_dict(self, ranks: Ranks) -> dict:
        """Every rank's carried lanes, in rank order (every rank must call this: it gathers)."""
        if self.carried is None:
            return {"carried": None}
        state, lanes = self.carried, self.carried_lanes.to(self.carried.device)
        if ranks.world_size > 1:
            # all_gather stacks a leading rank dim; lanes are dim 1 of every part of a state.
            state = type(state).from_state_dict({n: ranks.all_gather(t.transpose(0, 1).contiguous()).flatten(0, 1)
                                                 .transpose(0, 1) for n, t in state.parts().items()})
            lanes = ranks.all_gather(lanes).flatten(0, 1)
        # The state type's own state_dict: its parts by name (Mamba-2 / Mamba-1: ssm, conv; GLA: kv, conv).
        return {"carried": {"state": state.state_dict(), "lanes": lanes.cpu(), "world_size": ranks.world_size}}

    def load_state_dict(self, state: dict, ranks: Ranks) -> None:
        carried = state.get("carried")
        self.carried, self.carried_lanes = None, None
        if carried is None:
            return
        if carried["world_size"] != ranks.world_size:
            rank_zero_warn(f"the checkpoint carried lane states for world size {carried['world_size']} but this run "
                           f"has {ranks.world_size}; lanes cannot be mapped, so every lane restarts from a zero state")
            return
        per_rank = carried["lanes"].shape[0] // ranks.world_size
        rows = slice(ranks.rank * per_rank, (ranks.rank + 1) * per_rank)
        cls = type(self.zero_state)
        self.carried = cls.from_state_dict({n: t[:, rows] for n, t in carried["state"].items()})
        self.carried_lanes = carried["lanes"][rows].clone()


KINDS: dict[str, type[Intervention]] = {"none": Intervention, "random_noise": RandomNoise,
                                        "fitted_noise": FittedNoise, "state_passing": StatePassing,
                                        "tbptt": StatePassing}


def build_intervention(cfg: InterventionConfig, *, seed: int, zero_state: LayeredState) -> Intervention:
    """The intervention of cfg for a model whose one-lane zero state (on the CPU) is zero_state."""
    return KINDS[cfg.name](cfg, seed=seed, zero_state=zero_state)


def legacy_state(meta: dict) -> dict:
    """The intervention state of a checkpoint written before interventions owned their state (a hand-built
    carried dict and the fitted statistics side by side in the run metadata), in today's layout."""
    carried = meta.get("carried")
    if carried is not None:  # the state's parts by name next to lanes and world_size
        carried = {"state": {n: t for n, t in carried.items() if n not in ("lanes", "world_size")},
                   "lanes": carried["lanes"], "world_size": carried["world_size"]}
    return {"fitted_noise": meta.get("fitted_noise"), "carried": carried}


@torch.no_grad()
def fit_noise_stats(model: nn.Module, batches: Iterable[dict], *, num_batches: int, seq_len: int,
                    ranks: Ranks | None = None) -> FittedNoiseStats:
    """Per (layer, head) Gaussian of the final states of training sequences run from zeros (all ranks pooled)."""
    ranks = ranks or Ranks()
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    acc = Accumulator()
    sequences = 0
    try:
        for n, batch in enumerate(batches, start=1):
            _, final = model.forward_hidden(batch["input_ids"].to(device))
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
