"""GLA's entry in the architecture registry (recurlen.models.registry); its named models are rows of
recurlen.models.table."""

from __future__ import annotations

from recurlen.models.gla.model import GLALM
from recurlen.models.interface import Architecture

ARCHITECTURE = Architecture(name="gla", title="GLA", model_cls=GLALM,
                            demo_cost=2.1,  # its full demo ~12 min vs ~5.6 (2 idle cores)
                            variants=({"use_short_conv": True},))  # fla's short convs: windows join the state
