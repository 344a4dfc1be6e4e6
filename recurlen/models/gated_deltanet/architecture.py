"""Gated DeltaNet's entry in the architecture registry (recurlen.models.registry); its named models are rows of
recurlen.models.table."""

from __future__ import annotations

from recurlen.models.gated_deltanet.model import GatedDeltaNetLM
from recurlen.models.interface import Architecture

ARCHITECTURE = Architecture(name="gated_deltanet", title="Gated DeltaNet", model_cls=GatedDeltaNetLM,
                            # the demo's tiny training step costs ~0.7x Mamba-2's demo step (0.41 / 0.59 s and
                            # 0.46 / 0.65 s, one thread, the two interleaved on 2 cores shared with other jobs)
                            demo_cost=0.7,
                            # grouped value heads (a state and decay per value head) and beta in (0, 2)
                            variants=({"num_v_heads": 4, "allow_neg_eigval": True},))
