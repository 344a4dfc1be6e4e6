"""Mamba-1's entry in the architecture registry (recurlen.models.registry)."""

from __future__ import annotations

from recurlen.models.interface import Architecture
from recurlen.models.mamba1.config import PRESETS
from recurlen.models.mamba1.model import Mamba1LM

ARCHITECTURE = Architecture(name="mamba1", title="Mamba-1", model_cls=Mamba1LM, prefix="mamba1-", presets=PRESETS,
                            official_marker="state-spaces/mamba-")
