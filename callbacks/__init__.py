"""Lightning callbacks that run recurlen's diagnostics during validation."""

from callbacks.effrem import EffectiveRemembrance
from callbacks.hparams import HParamsTable
from callbacks.positionwise import PositionwisePerplexity
from callbacks.state_norm import StateNormMonitor

__all__ = ["EffectiveRemembrance", "HParamsTable", "PositionwisePerplexity", "StateNormMonitor"]
