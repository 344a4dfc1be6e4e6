"""GLA (gated linear attention, fla-hub/gla-*): config, typed state, chunked scan, LM, official checkpoints."""

from recurlen.models.gla.architecture import ARCHITECTURE
from recurlen.models.gla.config import GLAConfig
from recurlen.models.gla.model import GLALM
from recurlen.models.gla.state import GLAState

preset = ARCHITECTURE.preset
"""A named GLA model's config (the model table's rows, by size or name), fields overridden."""

__all__ = ["GLALM", "GLAConfig", "GLAState", "preset"]
