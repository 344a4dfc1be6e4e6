"""Lightning callbacks that run recurlen's diagnostics during validation."""

from recurlen.callbacks.effrem import EffectiveRemembrance
from recurlen.callbacks.hparams import HParamsTable
from recurlen.callbacks.positionwise import PositionwisePerplexity
from recurlen.callbacks.state_norm import StateNormMonitor

__all__ = ["EffectiveRemembrance", "HParamsTable", "PositionwisePerplexity", "StateNormMonitor"]
