"""GLA (gated linear attention, fla-hub/gla-*): config, typed state, chunked scan, LM, official checkpoints."""

from recurlen.models.gla.config import GLAConfig, preset
from recurlen.models.gla.model import GLALM
from recurlen.models.gla.state import GLAState

__all__ = ["GLALM", "GLAConfig", "GLAState", "preset"]
