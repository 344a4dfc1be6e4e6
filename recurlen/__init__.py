"""recurlen: post-train recurrent language models to generalize far beyond their training length."""

from recurlen.config import Mamba2Config, preset
from recurlen.model import Mamba2LM
from recurlen.state import RecurrentState

__all__ = ["Mamba2Config", "Mamba2LM", "RecurrentState", "preset"]
__version__ = "0.1.0"
