"""Mamba-1's entry in the architecture registry (recurlen.models.registry); its named models are rows of
recurlen.models.table."""

from __future__ import annotations

from recurlen.models.interface import Architecture
from recurlen.models.mamba1.model import Mamba1LM

ARCHITECTURE = Architecture(name="mamba1", title="Mamba-1", model_cls=Mamba1LM,
                            demo_cost=4.5)  # its full demo ~25 min vs ~5.6 (2 idle cores)
