"""Mamba-2 (state-spaces/mamba2-*): config, typed state, chunked SSD scan, kernels, LM, official checkpoints."""

from recurlen.models.mamba2.config import Mamba2Config
from recurlen.models.mamba2.model import Mamba2LM
from recurlen.models.mamba2.state import RecurrentState

__all__ = ["Mamba2Config", "Mamba2LM", "RecurrentState"]
