"""GLA (gated linear attention, fla-hub/gla-*): config, typed state, chunked scan, LM, official checkpoints."""

from recurlen.gla.config import GLAConfig, preset
from recurlen.gla.model import GLALM
from recurlen.gla.state import GLAState

__all__ = ["GLALM", "GLAConfig", "GLAState", "preset"]
