"""Mamba-3's entry in the architecture registry (recurlen.models.registry); its named models are rows of
recurlen.models.table."""

from __future__ import annotations

from recurlen.models.interface import Architecture
from recurlen.models.mamba3.model import Mamba3LM

ARCHITECTURE = Architecture(name="mamba3", title="Mamba-3", model_cls=Mamba3LM,
                            demo_cost=1.7,  # a tiny training step costs ~1.7x Mamba-2's (0.59 / 0.34 s, one thread)
                            # B and C shared by groups of heads, every pair of state entries turned, the norm gate
                            variants=({"ngroups": 2, "rope_fraction": 1.0, "is_outproj_norm": True},))
