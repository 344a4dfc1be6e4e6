"""GLA's entry in the architecture registry (recurlen.models.registry)."""

from __future__ import annotations

from recurlen.models.gla.config import PRESETS
from recurlen.models.gla.model import GLALM
from recurlen.models.interface import Architecture

ARCHITECTURE = Architecture(name="gla", title="GLA", model_cls=GLALM, prefix="gla-", presets=PRESETS,
                            official_marker="gla-")
