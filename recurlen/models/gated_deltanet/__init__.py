"""Gated DeltaNet (Yang, Kautz, Hatamizadeh, ICLR 2025; fla's GatedDeltaNetForCausalLM): config, typed state,
chunked scan, LM, checkpoints in fla's format."""

from recurlen.models.gated_deltanet.config import GatedDeltaNetConfig
from recurlen.models.gated_deltanet.model import GatedDeltaNetLM
from recurlen.models.gated_deltanet.state import GatedDeltaNetState

__all__ = ["GatedDeltaNetConfig", "GatedDeltaNetLM", "GatedDeltaNetState"]
