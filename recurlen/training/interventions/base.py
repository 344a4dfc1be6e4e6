"""What every intervention does in a run (the base class is `none`: every lane starts from zeros)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn

from recurlen.models.state import LayeredState
from recurlen.training.interventions.config import InterventionConfig
from recurlen.training.stateful import Ranks


def step_generator(seed: int, step: int, rank: int, stream: int, device: torch.device) -> torch.Generator:
    """A generator that depends only on (seed, step, rank, stream): resume-exact randomness."""
    g = torch.Generator(device=device)
    g.manual_seed((seed * 1_000_003 + step * 7_919 + rank * 104_729 + stream * 15_485_863) % (2**63 - 1))
    return g


class Intervention:
    """Decides each lane's initial state at each step, and owns whatever it remembers between steps.

    It reaches the run's other ranks through the Ranks it is built with, or connected to before a checkpoint
    is saved or restored (the LightningModule connects it in its setup hook: a trainer's ranks exist only
    from then on, and a checkpoint is restored right after). The LightningModule calls, in a run:
      bind(model)          once when it is built, before a strategy wraps (or shards) the model
      setup(...)           once before the first step (fitted noise fits or loads its statistics)
      initial_state(...)   each step: the state every lane of the batch starts from (the batch's new_stream
                           flags, and under the documents layout each row's segment within its document)
      observe(...)         each step: the batch's final states (state passing keeps them; fitted noise with
                           a refresh pools them, all ranks together at the end of a refresh window)
      scalars()            what to log each step (e.g. the refreshed noise's scale)
      state_dict() / load_state_dict(state)   into / out of every checkpoint, all ranks together (a Stateful)
    """

    passes_state = False
    """True when the final states of one step become the next step's initial states."""

    def __init__(self, cfg: InterventionConfig, *, seed: int, zero_state: LayeredState,
                 ranks: Ranks | None = None) -> None:
        self.cfg = cfg
        self.seed = seed
        self.zero_state = zero_state
        """A one-lane zero state of the model (on the CPU): its state type, parts and groups."""
        self.ranks = ranks or Ranks()

    @property
    def name(self) -> str:
        return self.cfg.name

    def connect(self, ranks: Ranks) -> None:
        """Reach the run's other ranks through `ranks` from now on."""
        self.ranks = ranks

    def bind(self, model: nn.Module) -> None:
        """Read what the intervention needs from the model's own parameters while they are whole (fitted noise:
        the decay rates its groups follow)."""

    def setup(self, model: nn.Module, batches: Callable[[int], dict], *, seq_len: int) -> None:
        """Before the first training step; `batches(step)` gives the training batch of a step."""

    def initial_state(self, *, zeros: LayeredState, lanes_B: torch.Tensor, new_stream_B: torch.Tensor, step: int,
                      rank: int, segment_B: torch.Tensor | None = None) -> LayeredState:
        return zeros

    def observe(self, final: LayeredState, lanes_B: torch.Tensor, *, step: int) -> None:
        """The final states of the step's lanes (with their autograd graph; keep only detached copies).
        Every rank calls it at every step, so it may use the ranks' collectives."""

    def scalars(self) -> dict[str, float]:
        """Values to log under train/ after each step."""
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore from state_dict(); every rank takes back what belongs to it."""
