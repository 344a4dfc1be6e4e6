"""Mamba-1 (state-spaces/mamba-*): config, typed state, chunked selective scan, LM, official checkpoints."""

from recurlen.models.mamba1.config import Mamba1Config, preset
from recurlen.models.mamba1.model import Mamba1LM
from recurlen.models.mamba1.state import Mamba1State

__all__ = ["Mamba1Config", "Mamba1LM", "Mamba1State", "preset"]
