"""What RWKV-6 and RWKV-7 share, written once (an architecture folder never imports another):

  RWKVConfig        the fields fla's RWKV6Config and RWKV7Config have in common (same names, same defaults unless
                    an architecture redeclares one), their checks and the channel-mix width
  RWKVState         the state of both: per layer the WKV matrix state and the two token shifts
  blinkdl_read_keys / blinkdl_write_keys
                    the walk over BlinkDL's .pth names that both release formats share (emb / ln_out / head at the
                    top, blocks.{i}.* per block, the embedding norm blocks.0.ln0); each architecture maps its own
                    block tensors through a hook

Legend: K layers, B lanes, H heads, Dk head key dim, Dv head value dim (RWKV-7: both N), D hidden size.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import torch

from recurlen.models.fla_model import FlaConfig
from recurlen.models.state import LayeredState
from recurlen.util.errors import UserError

S = TypeVar("S", bound="RWKVState")


# ---------------------------------------------------------------------------------- config
@dataclass
class RWKVConfig(FlaConfig):
    """fla's RWKV config fields that RWKV-6 and RWKV-7 share. An architecture adds its own fields (heads, low-rank
    sizes, chunk size), sets MODEL_TYPE / TITLE / RECURLEN_ONLY, derives group_norm_eps as fla does and calls
    check_rwkv() from its __post_init__."""

    hidden_size: int = 128
    """Width of the residual stream (BlinkDL: n_embd); RWKV-7's time mix also has it as its key and value width."""
    num_hidden_layers: int = 2
    """Number of blocks (time mix + channel mix each)."""
    hidden_ratio: float | None = 4
    """Channel-mix width when intermediate_size is None: hidden_size * hidden_ratio, rounded up to 32."""
    intermediate_size: int | None = None
    hidden_act: str = "sqrelu"
    attn_mode: str = "chunk"
    """fla's kernel choice; recurlen's scan is chunked either way ('chunk' or 'fused_recurrent' accepted)."""
    norm_first: bool = True
    """A LayerNorm on the embeddings before the first block (BlinkDL: blocks.0.ln0)."""
    norm_bias: bool = True
    norm_eps: float = 1e-5
    """LayerNorm eps; the per-head output GroupNorm's derives from it unless head_norm_eps is set (as fla: RWKV-6
    norm_eps itself, RWKV-7 head_dim * norm_eps)."""
    head_norm_eps: float | None = None
    """eps of the per-head output GroupNorm; None: derived from norm_eps as fla does. BlinkDL's models use 64e-5 for
    every head size (RWKV-6: 1e-5 * 8^2)."""
    vocab_size: int = 257
    tie_word_embeddings: bool = False
    initializer_range: float = 0.02

    def check_rwkv(self) -> None:
        """The checks of the shared fields: recurlen runs the squared-ReLU channel mix with an embedding norm."""
        if self.intermediate_size is None and (self.hidden_ratio is None or self.hidden_ratio <= 0):
            raise ValueError("model config: give intermediate_size or a positive hidden_ratio")
        if self.intermediate_size is not None:
            self.check_positive_ints(("intermediate_size",))
        if self.hidden_act != "sqrelu":
            raise ValueError(f"model config: hidden_act={self.hidden_act!r} is not supported; allowed: 'sqrelu'")
        if self.attn_mode not in ("chunk", "fused_recurrent"):
            raise ValueError(f"model config: attn_mode={self.attn_mode!r}; allowed: 'chunk', 'fused_recurrent'")
        if not self.norm_first:
            name = self.TITLE.split(" ", 1)[1]  # TITLE carries its article ("an RWKV-6")
            raise ValueError(f"model config: norm_first=false is not supported (every {name} checkpoint has the "
                             "embedding norm)")
        for key in ("norm_eps", "head_norm_eps"):
            value = getattr(self, key)
            if value is not None and not value > 0:
                raise ValueError(f"model config: {key} must be > 0; got {value}")

    @property
    def ffn_size(self) -> int:
        if self.intermediate_size is not None:
            return self.intermediate_size
        size = int(self.hidden_size * self.hidden_ratio)
        return 32 * ((size + 31) // 32)


# ---------------------------------------------------------------------------------- state
@dataclass
class RWKVState(LayeredState):
    """Per layer: the WKV matrix state (RECURRENT, float32 always, fitted noise per (layer, head)) and the time
    mix's and channel mix's token shifts, each the last token's normalised input (WINDOW: one token, no drift,
    carried by state passing only with pass_conv, as Mamba's conv windows are)."""

    wkv: torch.Tensor  # (K, B, H, Dk, Dv) float32
    att_shift: torch.Tensor  # (K, B, D)
    ffn_shift: torch.Tensor  # (K, B, D)

    RECURRENT: ClassVar[tuple[str, ...]] = ("wkv",)
    WINDOW: ClassVar[tuple[str, ...]] = ("att_shift", "ffn_shift")
    GROUP_DIMS: ClassVar[dict[str, int]] = {"wkv": 1}  # fitted noise per (layer, head)
    WKV_DIMS: ClassVar[str] = "head_dim, head_v_dim"
    """The names of wkv's last two dims, for the shape error."""

    def __post_init__(self) -> None:
        if self.wkv.dim() != 5 or self.att_shift.dim() != 3 or self.ffn_shift.dim() != 3:
            raise ValueError(f"{type(self).__name__} needs wkv (layers, batch, heads, {self.WKV_DIMS}), att_shift "
                             f"and ffn_shift (layers, batch, hidden); got {tuple(self.wkv.shape)}, "
                             f"{tuple(self.att_shift.shape)} and {tuple(self.ffn_shift.shape)}")
        super().__post_init__()

    @classmethod
    def zeros_for(cls: type[S], config: Any, batch: int, *, device: torch.device | str | None = None) -> S:
        lead = (config.num_hidden_layers, batch)
        return cls(torch.zeros(*lead, config.num_heads, config.head_dim, config.head_v_dim, device=device),
                   torch.zeros(*lead, config.hidden_size, device=device),
                   torch.zeros(*lead, config.hidden_size, device=device))


# ---------------------------------------------------------------------------------- BlinkDL's .pth names
BLINKDL_TOP = {"emb.weight": "model.embeddings.weight", "ln_out.weight": "model.norm.weight",
               "ln_out.bias": "model.norm.bias", "head.weight": "lm_head.weight"}
"""BlinkDL name -> fla name of the tensors outside the blocks."""
BLINKDL_BLOCK = re.compile(r"blocks\.(\d+)\.(.+)")

ReadHook = Callable[[int, str, torch.Tensor], "dict[str, torch.Tensor] | None"]
WriteHook = Callable[[int, str], dict[str, torch.Tensor]]


def blinkdl_layers(tensors: dict[str, torch.Tensor]) -> int:
    """The number of blocks in a BlinkDL state dict (one past the highest blocks.{i})."""
    return 1 + max(int(m.group(1)) for m in map(BLINKDL_BLOCK.fullmatch, tensors) if m)


def blinkdl_read_keys(tensors: dict[str, torch.Tensor], block: ReadHook, *, source: str, title: str,
                      unsupported: str) -> dict[str, torch.Tensor]:
    """A BlinkDL state dict under fla's names. The top-level tensors and the embedding norm (blocks.0.ln0 ->
    model.layers.0.pre_norm) are renamed here; every other block tensor goes to `block(i, rest, tensor)` (rest: the
    name after `blocks.{i}.`), which returns {name after `model.layers.{i}.`: tensor} ({} for a tensor it keeps for
    later or drops) or None for a name its architecture does not have. Such names are refused in one line, naming
    `title` (the architecture) and `unsupported` (what such files usually hold)."""
    out, unknown = {}, []
    for name, tensor in tensors.items():
        if name in BLINKDL_TOP:
            out[BLINKDL_TOP[name]] = tensor
            continue
        m = BLINKDL_BLOCK.fullmatch(name)
        if m is None:
            unknown.append(name)
            continue
        i, rest = int(m.group(1)), m.group(2)
        if i == 0 and rest in ("ln0.weight", "ln0.bias"):
            mapped = {"pre_norm." + rest.split(".")[1]: tensor}
        else:
            mapped = block(i, rest, tensor)
        if mapped is None:
            unknown.append(name)
        else:
            out.update({f"model.layers.{i}.{key}": value for key, value in mapped.items()})
    if unknown:
        raise UserError(f"{source}: keys recurlen's {title} does not have: {sorted(unknown)[:6]}"
                        f"{'...' if len(unknown) > 6 else ''} ({unsupported} are not supported)")
    return out


def blinkdl_write_keys(sd: dict[str, torch.Tensor], layers: int, block: WriteHook) -> dict[str, torch.Tensor]:
    """A model's state dict (fla's names) under BlinkDL's: the top-level tensors and the embedding norm here, each
    block's other tensors from `block(i, prefix)` ({name after `blocks.{i}.`: tensor}; prefix: `model.layers.{i}.`),
    every one contiguous."""
    out = {name: sd[fla] for name, fla in BLINKDL_TOP.items()}
    for i in range(layers):
        prefix = f"model.layers.{i}."
        if i == 0:
            out["blocks.0.ln0.weight"] = sd[prefix + "pre_norm.weight"]
            out["blocks.0.ln0.bias"] = sd[prefix + "pre_norm.bias"]
        out.update({f"blocks.{i}.{rest}": value for rest, value in block(i, prefix).items()})
    return {k: v.contiguous() for k, v in out.items()}


__all__ = ["BLINKDL_BLOCK", "BLINKDL_TOP", "RWKVConfig", "RWKVState", "blinkdl_layers", "blinkdl_read_keys",
           "blinkdl_write_keys"]
