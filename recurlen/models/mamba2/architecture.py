"""Mamba-2's entry in the architecture registry (recurlen.models.registry); its named models are rows of
recurlen.models.table."""

from __future__ import annotations

from recurlen.models.interface import Architecture
from recurlen.models.mamba2.model import Mamba2LM

ARCHITECTURE = Architecture(name="mamba2", title="Mamba-2", model_cls=Mamba2LM,
                            variants=({"ngroups": 2},))  # B and C shared by groups of heads
