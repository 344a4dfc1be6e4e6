"""Initial-state interventions: what state each lane starts from at each training step.

Ordered by how realistic the initial state is (Buitrago Ruiz & Gu, 2025):
  none            zeros (plain fine-tuning, the baseline)
  random_noise    i.i.d. N(0, std^2) on the SSM state, one std for all layers and heads
  fitted_noise    i.i.d. N(mean_kh, std_kh^2) per (layer, head), fitted on final states of training sequences
                  (fit_groups: the architecture's groups, or finer ones: blocks of entries, decay quantiles)
  state_passing   the lane's final state of the previous step (an unrelated sequence), detached
  tbptt           truncated backprop through time as the paper defines it: a long sequence is one document
                  (tbptt_over=documents), run in consecutive segments of T tokens from a zero state with the
                  state carried and the gradient stopped between segments; the lane's next document starts
                  from zeros again (tbptt_over=stream: windows of tbptt_segments x T of an EOS-joined stream)

Noise and reset draws come from generators seeded by (seed, step, rank): a resumed run draws exactly
what the uninterrupted run drew, without saving any RNG state.
Each intervention owns what it remembers between steps (carried lane states, fitted statistics) and
saves it into the checkpoint itself (a recurlen.training.stateful.Stateful).

  config.py          InterventionConfig: the experiment's intervention section
  base.py            Intervention: what every intervention does in a run (and `none`)
  noise.py           random_noise, fitted_noise
  noise_stats.py     the fitted-noise statistics and fitting them before training
  noise_groups.py    the groups fitted noise is fitted over (fit_groups: default, blocks, decay)
  noise_refresh.py   fitted noise refreshed from the final states seen in training
  state_passing.py   state_passing, tbptt
  build.py           an intervention from its config; the state of older checkpoints
"""

from recurlen.training.interventions.base import Intervention, step_generator
from recurlen.training.interventions.build import KINDS, build_intervention, legacy_state
from recurlen.training.interventions.config import INTERVENTIONS, LAYOUT_FOR, TBPTT_OVER, InterventionConfig, layout_for
from recurlen.training.interventions.noise import FittedNoise, RandomNoise
from recurlen.training.interventions.noise_groups import FIT_GROUPS, NoiseGroups, build_groups
from recurlen.training.interventions.noise_refresh import REFRESH_MODES, StatsRefresh
from recurlen.training.interventions.noise_stats import Accumulator, FittedNoiseStats, fit_noise_stats, noise_part
from recurlen.training.interventions.state_passing import StatePassing
from recurlen.training.stateful import Ranks

__all__ = ["FIT_GROUPS", "INTERVENTIONS", "KINDS", "LAYOUT_FOR", "REFRESH_MODES", "TBPTT_OVER", "Accumulator",
           "FittedNoise", "FittedNoiseStats", "Intervention", "InterventionConfig", "NoiseGroups", "RandomNoise",
           "Ranks", "StatePassing", "StatsRefresh", "build_groups", "build_intervention", "fit_noise_stats",
           "layout_for", "legacy_state", "noise_part", "step_generator"]
