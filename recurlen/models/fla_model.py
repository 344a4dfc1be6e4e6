"""flash-linear-attention's language-model layout, shared by every architecture that follows it:

    model.embeddings.weight     (V, D)
    model.layers.{i}.*          the architecture's blocks
    model.norm.*                (D,)
    lm_head.weight              (V, D), tied to the embedding when tie_word_embeddings

with what fla's configs have in common (hidden_size, num_hidden_layers, num_heads, expand_k / expand_v, model_type
in config.json), fla's from-scratch initialisation, and how fla's chunked kernels are called (their layout
keywords, the state in and out). An architecture in this layout provides its blocks, its final norm, the fields of
its config and what its kernel computes; the rest is here.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import fields
from typing import Any, ClassVar, TypeVar

import torch
import torch.nn as nn
import torch.nn.functional as F

from recurlen.models.config import ModelConfig
from recurlen.models.layers import RMSNorm
from recurlen.models.lm import StatefulLM
from recurlen.models.resets import Varlen

C = TypeVar("C", bound="FlaConfig")


# ---------------------------------------------------------------------------------- config
class FlaConfig(ModelConfig):
    """A mixin for a config dataclass in fla's naming (fields hidden_size, num_hidden_layers, num_heads, expand_k,
    expand_v, vocab_size). The architecture sets MODEL_TYPE (config.json's model_type), TITLE (its name in
    messages, with its article: "a GLA") and RECURLEN_ONLY (its fields that are not fla's: never written to nor
    read from an official config.json; recurlen_config.json keeps them)."""

    MODEL_TYPE: ClassVar[str]
    TITLE: ClassVar[str]
    RECURLEN_ONLY: ClassVar[frozenset[str]]

    # ------------------------------------------------------------------ derived sizes
    @property
    def key_dim(self) -> int:
        return int(self.hidden_size * self.expand_k)

    @property
    def value_dim(self) -> int:
        return int(self.hidden_size * self.expand_v)

    @property
    def head_v_dim(self) -> int:
        return self.value_dim // self.num_heads

    @property
    def n_layer(self) -> int:
        return self.num_hidden_layers

    # ------------------------------------------------------------------ checks
    def check_range(self, name: str) -> None:
        """A from-scratch init range: null or [low, high] with low <= high (omegaconf's lists become tuples)."""
        value = getattr(self, name)
        if value is None:
            return
        value = tuple(float(a) for a in value)
        setattr(self, name, value)
        if len(value) != 2 or not value[0] <= value[1]:
            raise ValueError(f"model config: {name} must be null or [low, high] with low <= high; got {value}")

    def check_head_dims(self) -> None:
        for name, dim in (("key_dim", self.key_dim), ("value_dim", self.value_dim)):
            if dim <= 0 or dim % self.num_heads:
                raise ValueError(f"model config: {name}={dim} must be a positive multiple of "
                                 f"num_heads={self.num_heads}")

    @classmethod
    def recognises(cls, raw: dict[str, Any]) -> bool:
        """True for this architecture's fla config.json."""
        return raw.get("model_type") == cls.MODEL_TYPE

    # ------------------------------------------------------------------ official config.json
    def official_json(self, **fixed: Any) -> dict[str, Any]:
        """fla's config as its `save_pretrained` writes it: every field but RECURLEN_ONLY, model_type and `fixed`
        (the keys fla has and recurlen does not vary)."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in self.RECURLEN_ONLY}
        d.update(model_type=self.MODEL_TYPE, **fixed)
        return d

    @classmethod
    def official_kwargs(cls, cfg: dict[str, Any], *, source: str, refused: dict[str, Any]) -> dict[str, Any]:
        """The fields of an fla config.json, after checking its model_type, the required sizes and the options in
        `refused` (key -> the one value recurlen runs; null / false also accept an absent or empty value)."""
        if cfg.get("model_type") != cls.MODEL_TYPE:
            raise ValueError(f"{source}: model_type is {cfg.get('model_type')!r}; {cls.TITLE} checkpoint has "
                             f"{cls.MODEL_TYPE!r}")
        for key, want in refused.items():
            value = cfg.get(key, want)
            if (bool(value) if want is None or want is False else value != want):
                note = " (hybrid attention layers)" if key == "attn" else ""
                raise ValueError(f"{source}: {key}={value!r}{note} is not supported (need {json.dumps(want)})")
        for name in ("hidden_size", "num_hidden_layers", "num_heads", "vocab_size"):
            if name not in cfg:
                raise ValueError(f"{source}: missing required key {name!r}")
        mapped = {f.name for f in fields(cls)} - cls.RECURLEN_ONLY
        return {k: v for k, v in cfg.items() if k in mapped}


# ---------------------------------------------------------------------------------- blocks
def swiglu_width(hidden_size: int, hidden_ratio: float, intermediate_size: int | None) -> int:
    """fla's GatedMLP width: intermediate_size, or 2/3 * hidden_size * hidden_ratio rounded up to 256."""
    if intermediate_size is not None:
        return intermediate_size
    size = int(hidden_size * hidden_ratio * 2 / 3)
    return 256 * ((size + 255) // 256)


class GatedMLP(nn.Module):
    """fla's GatedMLP (SwiGLU): down_proj(silu(gate_proj(x)) * up_proj(x))."""

    def __init__(self, hidden_size: int, width: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, width, bias=False)
        self.up_proj = nn.Linear(hidden_size, width, bias=False)
        self.down_proj = nn.Linear(width, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class FlaBlock(nn.Module):
    """fla's pre-norm block: h + attn(attn_norm(h)), then + mlp(mlp_norm(.)). The token mixer `attn` is called as
    `out, *parts = attn(x, *parts, use_kernels=...)` and `attn.step(x, *parts)` (parts: its layer's state)."""

    def __init__(self, attn: nn.Module, *, hidden_size: int, mlp_width: int, eps: float) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(hidden_size, eps=eps)
        self.attn = attn
        self.mlp_norm = RMSNorm(hidden_size, eps=eps)
        self.mlp = GatedMLP(hidden_size, mlp_width)

    def _finish(self, residual: torch.Tensor, mixed: torch.Tensor) -> torch.Tensor:
        residual = residual + mixed
        return residual + self.mlp(self.mlp_norm(residual))

    def forward(self, hidden: torch.Tensor, parts: tuple[torch.Tensor, ...], *, use_kernels: bool,
                resets: torch.Tensor | None = None):
        extra = {} if resets is None else {"resets": resets}  # documents packed in the row (recurlen.models.resets)
        mixed, *parts = self.attn(self.attn_norm(hidden), *parts, use_kernels=use_kernels, **extra)
        return self._finish(hidden, mixed), tuple(parts)

    def step(self, hidden: torch.Tensor, parts: tuple[torch.Tensor, ...]):
        mixed, *parts = self.attn.step(self.attn_norm(hidden), *parts)
        return self._finish(hidden, mixed), tuple(parts)


# ---------------------------------------------------------------------------------- the LM
class FlaBackbone(nn.Module):
    def __init__(self, embeddings: nn.Embedding, layers: Iterable[nn.Module], norm: nn.Module) -> None:
        super().__init__()
        self.embeddings = embeddings
        self.layers = nn.ModuleList(layers)
        self.norm = norm


class FlaLM(StatefulLM):
    """An LM in fla's layout: embeddings -> the architecture's blocks -> norm -> LM head, with state in and out (the
    shell is StatefulLM's). A subclass gives `make_blocks(config)`, `make_norm(config)`, the residual outputs of a
    block (`residual_outputs`) and its own from-scratch init of a block (`init_block`)."""

    def __init__(self, config: Any, *, backend: str = "auto") -> None:
        super().__init__(config, backend=backend)
        self.model = FlaBackbone(nn.Embedding(config.vocab_size, config.hidden_size), self.make_blocks(config),
                                 self.make_norm(config))
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self._init_weights()
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embeddings.weight

    @staticmethod
    def make_blocks(config: Any) -> list[nn.Module]:
        raise NotImplementedError

    @staticmethod
    def make_norm(config: Any) -> nn.Module:
        raise NotImplementedError

    @staticmethod
    def residual_outputs(block: nn.Module) -> tuple[nn.Linear, ...]:
        """The block's projections that write into the residual stream (rescaled at init)."""
        raise NotImplementedError

    def init_block(self, block: nn.Module) -> None:
        """The architecture's own from-scratch init of a block, after fla's (default: none)."""

    @torch.no_grad()
    def _init_weights(self) -> None:
        """fla's from-scratch init: N(0, initializer_range) linears, convs and embedding, zero biases, each block's
        residual outputs rescaled by 1/sqrt(2 K) (K blocks); then the architecture's `init_block`."""
        cfg = self.config
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Conv1d, nn.Embedding)):
                nn.init.normal_(module.weight, std=cfg.initializer_range)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
        for block in self.model.layers:
            for lin in self.residual_outputs(block):
                nn.init.kaiming_uniform_(lin.weight, a=math.sqrt(5))
                lin.weight /= math.sqrt(2 * cfg.num_hidden_layers)
            self.init_block(block)

    @property
    def embedding(self) -> nn.Embedding:
        return self.model.embeddings

    @property
    def layers(self) -> nn.ModuleList:
        return self.model.layers

    def finish(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.norm(hidden)


# ---------------------------------------------------------------------------------- fla's kernels
FLA_INSTALL_CUDA = "pip install 'recurlen[gla]' (flash-linear-attention)"
FLA_INSTALL_CPU = "make test-kernels installs fla-core"


def load_fla_op(module: str, name: str) -> tuple[Callable | None, str | None]:
    """(fla's op, None), or (None, why it did not import); the caller caches it (a kernel imports once)."""
    try:
        return getattr(importlib.import_module(module), name), None
    except Exception as err:  # ImportError, or Triton failing to initialise
        return None, f"{type(err).__name__}: {err}"


def layout_kwargs(fn: Callable) -> dict:
    """Keyword arguments that pin fla's layout where the installed release has them: (B, T, H, K) inputs
    (`head_first` was the default layout once), (N, H, K, V) states (`state_v_first` came later)."""
    params = inspect.signature(fn).parameters
    return {name: False for name in ("head_first", "state_v_first") if name in params}


def run_chunked(fn: Callable, *inputs: torch.Tensor, initial_state_BHKV: torch.Tensor,
                resets_BL: torch.Tensor | None = None, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """One of fla's chunked ops with the state in and out (float32, contiguous in; the final state comes back
    float32). The positional inputs are per token, (B, L, ...); with `resets_BL` (documents packed in the rows,
    recurlen.models.resets) they go in as one sequence of documents (`cu_seqlens`, fla's varlen form), each row's
    first document from the row's state, the others from zeros, and each row's last document's state comes back."""
    if resets_BL is None:
        o, final = fn(*inputs, **kwargs, initial_state=initial_state_BHKV.float().contiguous(),
                      output_final_state=True, **layout_kwargs(fn))
        return o, final.float()
    varlen = Varlen.of(resets_BL)
    o, finals = fn(*(Varlen.flatten(t) for t in inputs), **kwargs,
                   initial_state=varlen.initial(initial_state_BHKV.float()).contiguous(), output_final_state=True,
                   cu_seqlens=varlen.cu_seqlens, **layout_kwargs(fn))
    return o.view(*resets_BL.shape, *o.shape[2:]), finals.float().index_select(0, varlen.last)


def cached_loader(module: str, name: str) -> Callable[[], tuple[Callable | None, str | None]]:
    """A cached `load_fla_op(module, name)` (its `cache_clear` makes it import again)."""
    return functools.lru_cache(maxsize=1)(lambda: load_fla_op(module, name))


__all__ = ["FLA_INSTALL_CPU", "FLA_INSTALL_CUDA", "FlaBackbone", "FlaBlock", "FlaConfig", "FlaLM", "GatedMLP",
           "cached_loader", "layout_kwargs", "load_fla_op", "run_chunked", "swiglu_width"]
