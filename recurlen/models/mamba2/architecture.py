"""Mamba-2's entry in the architecture registry (recurlen.models.registry)."""

from __future__ import annotations

from recurlen.models.interface import Architecture
from recurlen.models.mamba2.config import PRESETS
from recurlen.models.mamba2.model import Mamba2LM

ARCHITECTURE = Architecture(name="mamba2", title="Mamba-2", model_cls=Mamba2LM, prefix="", presets=PRESETS,
                            official_marker="mamba2-")
