"""What goes into a checkpoint: parts with the same two methods, and the ranks a part reaches when it saves.

Every part of a run that a checkpoint holds (the intervention, its fitted-noise statistics and refresh, the
DataModule's stream position) is a `Stateful`: `state_dict()` returns what to save, `load_state_dict(state)`
takes it back. A part whose state spans the ranks of a run (carried lane states, per-rank refresh windows) is
given its `Ranks` when it is built or connected, before a checkpoint is saved or restored; nothing about the
run's processes is passed to these two methods.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]:
        """What to save; under DDP every rank calls it at once (a part may gather), rank 0 writes the file."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take back what state_dict() returned; every rank takes the part that belongs to it."""
        ...


@dataclass
class Ranks:
    """How a part reaches the other ranks of its run (a single process: rank 0 of 1, no communication)."""

    rank: int = 0
    world_size: int = 1
    all_gather: Callable[[torch.Tensor], torch.Tensor] | None = None
    """tensor -> (world_size, *tensor.shape), every rank's tensor; called on every rank at once."""
    all_reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None
    """tensor -> the sum of every rank's tensor; called on every rank at once."""
