"""Mamba-1 (state-spaces/mamba-*): config, typed state, chunked selective scan, LM, official checkpoints."""

from recurlen.models.mamba1.architecture import ARCHITECTURE
from recurlen.models.mamba1.config import Mamba1Config
from recurlen.models.mamba1.model import Mamba1LM
from recurlen.models.mamba1.state import Mamba1State

preset = ARCHITECTURE.preset
"""A named Mamba-1 model's config (the model table's rows, by size or name), fields overridden."""

__all__ = ["Mamba1Config", "Mamba1LM", "Mamba1State", "preset"]
