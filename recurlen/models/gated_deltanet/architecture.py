"""Gated DeltaNet's entry in the architecture registry (recurlen.models.registry); its named models are rows of
recurlen.models.table."""

from __future__ import annotations

from recurlen.models.gated_deltanet.model import GatedDeltaNetLM
from recurlen.models.interface import Architecture

ARCHITECTURE = Architecture(name="gated_deltanet", title="Gated DeltaNet", model_cls=GatedDeltaNetLM,
                            # grouped value heads (a state and decay per value head) and beta in (0, 2)
                            variants=({"num_v_heads": 4, "allow_neg_eigval": True},))
