"""RWKV-6's entry in the architecture registry (recurlen.models.registry); its named models are rows of
recurlen.models.table."""

from __future__ import annotations

from recurlen.models.interface import Architecture
from recurlen.models.rwkv6.model import RWKV6LM

ARCHITECTURE = Architecture(name="rwkv6", title="RWKV-6", model_cls=RWKV6LM,
                            demo_cost=2.7)  # a tiny step costs ~1.3x GLA's
