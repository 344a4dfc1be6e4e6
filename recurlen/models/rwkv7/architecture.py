"""RWKV-7's entry in the architecture registry (recurlen.models.registry); its named models are rows of
recurlen.models.table."""

from __future__ import annotations

from recurlen.models.interface import Architecture
from recurlen.models.rwkv7.model import RWKV7LM

ARCHITECTURE = Architecture(name="rwkv7", title="RWKV-7", model_cls=RWKV7LM,
                            demo_cost=3.0)  # first estimate only: RWKV-6's 2.7 plus the WY solve per chunk
