"""An intervention from its config, and the state of checkpoints written before interventions owned theirs."""

from __future__ import annotations

from recurlen.models.state import LayeredState
from recurlen.training.interventions.base import Intervention
from recurlen.training.interventions.config import InterventionConfig
from recurlen.training.interventions.noise import FittedNoise, RandomNoise
from recurlen.training.interventions.state_passing import StatePassing
from recurlen.training.stateful import Ranks

KINDS: dict[str, type[Intervention]] = {"none": Intervention, "random_noise": RandomNoise,
                                        "fitted_noise": FittedNoise, "state_passing": StatePassing,
                                        "tbptt": StatePassing}


def build_intervention(cfg: InterventionConfig, *, seed: int, zero_state: LayeredState,
                       ranks: Ranks | None = None) -> Intervention:
    """The intervention of cfg for a model whose one-lane zero state (on the CPU) is zero_state; ranks: how it
    reaches the run's other ranks (by default a single process; see Intervention.connect)."""
    return KINDS[cfg.name](cfg, seed=seed, zero_state=zero_state, ranks=ranks)


def legacy_state(meta: dict) -> dict:
    """The intervention state of a checkpoint written before interventions owned their state (a hand-built
    carried dict and the fitted statistics side by side in the run metadata), in today's layout."""
    carried = meta.get("carried")
    if carried is not None:  # the state's parts by name next to lanes and world_size
        carried = {"state": {n: t for n, t in carried.items() if n not in ("lanes", "world_size")},
                   "lanes": carried["lanes"], "world_size": carried["world_size"]}
    return {"fitted_noise": meta.get("fitted_noise"), "carried": carried}
