"""RWKV-7 ("Goose"; BlinkDL's x070 .pth and fla-hub/rwkv7-*): config, typed state, chunked scan, LM, both checkpoint
formats."""

from recurlen.models.rwkv7.config import RWKV7Config
from recurlen.models.rwkv7.model import RWKV7LM
from recurlen.models.rwkv7.state import RWKV7State

__all__ = ["RWKV7Config", "RWKV7LM", "RWKV7State"]
