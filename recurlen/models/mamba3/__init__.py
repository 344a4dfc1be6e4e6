"""Mamba-3 (SISO; mamba-ssm's Mamba3 mixer): config, typed state, chunked scan, kernel path, LM."""

from recurlen.models.mamba3.config import Mamba3Config
from recurlen.models.mamba3.model import Mamba3LM
from recurlen.models.mamba3.state import Mamba3State

__all__ = ["Mamba3Config", "Mamba3LM", "Mamba3State"]
