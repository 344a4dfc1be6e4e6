"""RWKV-6 (Finch; BlinkDL's .pth and fla-hub/rwkv6-*): config, typed state, chunked scan, LM, both checkpoint
formats."""

from recurlen.models.rwkv6.architecture import ARCHITECTURE
from recurlen.models.rwkv6.config import RWKV6Config
from recurlen.models.rwkv6.model import RWKV6LM
from recurlen.models.rwkv6.state import RWKV6State

preset = ARCHITECTURE.preset
"""A named RWKV-6 model's config (the model table's rows, by size or name), fields overridden."""

__all__ = ["RWKV6LM", "RWKV6Config", "RWKV6State", "preset"]
