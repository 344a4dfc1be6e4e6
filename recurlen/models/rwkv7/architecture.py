"""RWKV-7's entry in the architecture registry (recurlen.models.registry); its named models are rows of
recurlen.models.table."""

from __future__ import annotations

from recurlen.models.interface import Architecture
from recurlen.models.rwkv7.model import RWKV7LM

ARCHITECTURE = Architecture(name="rwkv7", title="RWKV-7", model_cls=RWKV7LM,
                            # the demo's tiny training step costs ~1.4x Mamba-2's demo step (0.537 / 0.382 s and
                            # 0.625 / 0.451 s medians, one thread, the two interleaved on 2 cores shared with other
                            # jobs)
                            demo_cost=1.4)
