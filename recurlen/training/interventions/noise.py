"""Noise interventions: every lane starts from a fresh draw on the state's recurrent part.

Draws come from generators seeded by (seed, step, rank): a resumed run draws exactly what the uninterrupted run
drew, without saving any RNG state.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import torch.nn as nn

from recurlen.models.state import LayeredState
from recurlen.training.interventions.base import Intervention, step_generator
from recurlen.training.interventions.config import InterventionConfig
from recurlen.training.interventions.noise_groups import NoiseGroups, build_groups
from recurlen.training.interventions.noise_refresh import StatsRefresh
from recurlen.training.interventions.noise_stats import FittedNoiseStats, fit_noise_stats, noise_part
from recurlen.training.stateful import Ranks
from recurlen.util.errors import UserError

log = logging.getLogger(__name__)


class RandomNoise(Intervention):
    """i.i.d. N(0, noise_std^2) on the state's recurrent part; the other parts (conv windows) start from zeros."""

    def noise(self, eps: torch.Tensor, zeros: LayeredState, part: str) -> torch.Tensor:
        return eps * self.cfg.noise_std

    def initial_state(self, *, zeros: LayeredState, lanes_B: torch.Tensor, new_stream_B: torch.Tensor, step: int,
                      rank: int, segment_B: torch.Tensor | None = None) -> LayeredState:
        device, part = zeros.device, noise_part(zeros)
        g = step_generator(self.seed, step, rank, stream=1, device=device)
        eps = torch.randn(getattr(zeros, part).shape, generator=g, device=device, dtype=torch.float32)
        noise = self.noise(eps, zeros, part)
        return zeros._map(lambda n, t: noise if n == part else t)


class FittedNoise(RandomNoise):
    """N(mean, std^2) per (layer, group) of the state type (Mamba-2 / GLA: head, Mamba-1: layer), or of the
    finer groups fit_groups asks for (recurlen.training.interventions.noise_groups), fitted on the final states
    of training sequences run from zeros; with fit_refresh, updated from the final states seen in training
    (recurlen.training.interventions.noise_refresh)."""

    def __init__(self, cfg: InterventionConfig, *, seed: int, zero_state: LayeredState,
                 ranks: Ranks | None = None) -> None:
        super().__init__(cfg, seed=seed, zero_state=zero_state, ranks=ranks)
        self.stats: FittedNoiseStats | None = None
        self.bound_groups: NoiseGroups | None = None
        """The groups of fit_groups on the model as built (bind), for the first fit."""
        self.refresh = None if cfg.fit_refresh == "none" else StatsRefresh(
            cfg.fit_refresh, every=cfg.fit_refresh_every, decay=cfg.fit_ema, ranks=self.ranks)

    def connect(self, ranks: Ranks) -> None:
        super().connect(ranks)
        if self.refresh is not None:
            self.refresh.ranks = ranks

    def set_stats(self, stats: FittedNoiseStats) -> None:
        stats.check_state(self.zero_state)
        want, count = self.cfg.fit_groups, self.cfg.fit_group_count
        if stats.groups.kind != want or (want != "default" and stats.groups.count != count):
            asked = want if want == "default" else f"{want} ({count} per layer)"
            raise ValueError(f"the fitted-noise statistics are grouped {stats.groups.describe()}; this run asks for "
                             f"intervention.fit_groups={asked}")
        self.stats = stats

    def bind(self, model: nn.Module) -> None:
        self.bound_groups = self.groups(model)

    def groups(self, model: nn.Module | None = None) -> NoiseGroups:
        """The grouping intervention.fit_groups asks for on this model (a one-line user error where the model
        cannot have it; decay reads the model's decay rates)."""
        return build_groups(self.cfg.fit_groups, self.cfg.fit_group_count, zeros=self.zero_state,
                            part=noise_part(self.zero_state), model=model)

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

    def setup(self, model: nn.Module, batches: Callable[[int], dict], *, seq_len: int) -> None:
        super().setup(model, batches, seq_len=seq_len)
        if self.stats is None:  # else restored from a checkpoint
            self.set_stats(self._initial_stats(model, batches, seq_len=seq_len))
        if self.refresh is not None:  # starts from these unless the checkpoint restored the refresh's moments
            self.refresh.start(self.stats.mean_KH, self.stats.std_KH)

    def _initial_stats(self, model: nn.Module, batches: Callable[[int], dict], *, seq_len: int) -> FittedNoiseStats:
        if self.cfg.fit_stats:
            self.load_stats_file()  # checked against this model: a user error names the file
            return self.stats
        n = self.cfg.fit_batches
        stats = fit_noise_stats(model, (batches(step) for step in range(n)), num_batches=n, seq_len=seq_len,
                                ranks=self.ranks, groups=self.bound_groups or self.groups(model))
        log.info("fitted noise on the final states of %d sequences (groups: %s): mean |mu| %.3g, mean sigma %.3g",
                 stats.num_states, stats.groups.describe(), stats.mean_KH.abs().mean().item(),
                 stats.std_KH.mean().item())
        return stats

    def observe(self, final: LayeredState, lanes_B: torch.Tensor, *, step: int) -> None:
        super().observe(final, lanes_B, step=step)
        if self.refresh is None:
            return
        assert self.stats is not None
        self.refresh.add(self.stats.groups.view(final, noise_part(final)), lanes=int(lanes_B.shape[0]))
        if self.refresh.due(step):
            mean, std = self.refresh.refresh()
            self.stats = FittedNoiseStats(mean, std, num_states=self.refresh.states_seen, seq_len=self.stats.seq_len,
                                          groups=self.stats.groups)

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
        groups, dims = self.stats.groups, zeros.GROUP_DIMS.get(part, 0)
        return groups.per_entry(self.stats.mean_KH, eps, dims) + groups.per_entry(self.stats.std_KH, eps, dims) * eps

    def state_dict(self) -> dict:
        """The statistics; with a refresh also its moments and every rank's open window (all ranks call this)."""
        state = {"fitted_noise": None if self.stats is None else self.stats.state_dict()}
        if self.refresh is not None and self.refresh.moments is not None:
            state["fitted_noise_refresh"] = self.refresh.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        if state.get("fitted_noise") is not None:
            try:
                self.set_stats(FittedNoiseStats.from_state_dict(state["fitted_noise"]))
            except ValueError as err:  # e.g. a checkpoint written before fit_groups, resumed with finer groups
                raise UserError(f"the checkpoint's fitted noise does not fit this run: {err}; resume it with its own "
                                "settings, or start a new run (resume=archive)") from err
        # A checkpoint without a refresh (or a run that turned it on later) starts refreshing from the restored
        # statistics in setup(); one with a refresh but a run without keeps the statistics as they were.
        saved = state.get("fitted_noise_refresh")
        if self.refresh is not None and saved is not None:
            if saved["mode"] != self.refresh.mode:
                # Imported here: composing a config imports this package, and Lightning costs seconds to import.
                from lightning.pytorch.utilities import rank_zero_warn

                rank_zero_warn(f"the checkpoint's fitted-noise refresh was {saved['mode']!r}, this run's is "
                               f"{self.refresh.mode!r}: it continues from the saved moments with the new rule")
            self.refresh.load_state_dict(saved)
