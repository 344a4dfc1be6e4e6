"""The LM shell, written once for every architecture:

    logits, state = model(ids_BL, state)            # state in (None = zeros), final state out
    logits, state = model(ids_BL, state, resets=r)  # documents packed in a row: r (B, L) bool, True where one starts
    hidden, state = model.forward_hidden(ids_BL, state);  logits = model.logits_from_hidden(hidden)
    logits_BV, state = model.step(ids_B, state)     # one token, for generation
    model.zero_state(batch)                         # the architecture's LayeredState
    model.state_decays()                            # per-entry decay rates of the state, where they are parameters

Backend choice, the input and state checks, the block loop (a whole sequence, or one token), the head, and
official-format loading and saving live here. An architecture's LM subclasses `StatefulLM`, builds its modules
under their official names in `__init__` (so checkpoints load without renaming), and says:

    config_cls, state_cls   its config dataclass and its LayeredState type
    kernels                 its optional kernels (a KernelPath)
    official                its checkpoint format (an OfficialFormat)
    transformers            its format in transformers, where transformers has a class for it (a TransformersFormat)
    weights_file            its release format as one weights file without config.json, where it has one
                            (a WeightsFileFormat: from_pretrained then also takes such a file)
    embedding, layers       the nn.Embedding and the ModuleList of blocks
    start(hidden) / finish(carry)   what flows between blocks (default: the hidden states) and the final norm

A block is called as `carry, parts = block(carry, parts, use_kernels=...)` and `block.step(carry, parts)`, where
`parts` is that layer's state as a tuple in the state type's field order. An architecture that sets
`supports_resets = True` also takes `resets=` (a (batch, length) bool, recurlen.models.resets): at a flagged position
its scan zeroes every part of the carried state, so the position sees what a fresh sequence's first token sees; the
block is given `resets=` only when a caller passes one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn as nn
import torch.nn.functional as F

from recurlen.models import official, transformers_format
from recurlen.models.backends import KernelPath, check_backend
from recurlen.models.official import OfficialFormat
from recurlen.models.resets import check_resets
from recurlen.models.state import LayeredState
from recurlen.models.transformers_format import TransformersFormat
from recurlen.models.weights_file import WeightsFileFormat
from recurlen.util.errors import UserError
from recurlen.util.hub import resolve_hub_file, resolve_pretrained_dir


class _HeadRows(torch.autograd.Function):
    """F.linear(hidden, weight[:rows]), with the weight's gradient written straight into one of the weight's size.

    Autograd would compute the (rows x D) gradient, then zero-fill a full-size one and copy it in (the slice's
    backward): for a 50k vocabulary that is two more passes over the whole matrix per step. The products are
    the ones autograd runs for F.linear, in the same layouts, so the results are the same bits.
    """

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, rows: int) -> torch.Tensor:
        ctx.save_for_backward(hidden, weight)
        ctx.rows = rows
        return F.linear(hidden, weight[:rows])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        hidden, weight = ctx.saved_tensors
        rows = ctx.rows
        grad_2d = grad.reshape(-1, rows)
        grad_hidden = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_hidden = grad_2d.mm(weight[:rows]).view(hidden.shape)
        if ctx.needs_input_grad[1]:
            grad_weight = torch.empty_like(weight, memory_format=torch.contiguous_format)
            torch.mm(grad_2d.t(), hidden.reshape(-1, hidden.shape[-1]), out=grad_weight[:rows])
            grad_weight[rows:].zero_()
        return grad_hidden, grad_weight, None


class StatefulLM(nn.Module):
    config_cls: ClassVar[type]
    state_cls: ClassVar[type[LayeredState]]
    kernels: ClassVar[KernelPath]
    official: ClassVar[OfficialFormat]
    transformers: ClassVar[TransformersFormat | None] = None
    weights_file: ClassVar[WeightsFileFormat | None] = None
    supports_resets: ClassVar[bool] = False
    """True where the blocks take `resets=` (documents packed in one row, the state reset where each starts)."""

    def __init__(self, config: Any, *, backend: str = "auto") -> None:
        super().__init__()
        self.config = config
        self.backend = backend
        self.score_padded_vocab = False
        """True: logits over the whole padded head, normalised as the reference models do (50288 rows for the
        Pile Mamba-2 models); False (default): only the vocab_size real rows."""

    # ------------------------------------------------------------------ what an architecture provides
    @property
    def embedding(self) -> nn.Embedding:
        raise NotImplementedError

    @property
    def layers(self) -> nn.ModuleList:
        raise NotImplementedError

    def start(self, hidden: torch.Tensor) -> Any:
        """The carry into the first block (default: the embedded tokens)."""
        return hidden

    def finish(self, carry: Any) -> torch.Tensor:
        """The final hidden states (after the last norm) from the carry out of the last block."""
        raise NotImplementedError

    # ------------------------------------------------------------------ backend
    @property
    def backend(self) -> str:
        return self._backend

    @backend.setter
    def backend(self, value: str) -> None:
        self._backend = check_backend(value)

    def _use_kernels(self, device: torch.device, backend: str | None) -> bool:
        return self.kernels.uses_kernels(self.backend if backend is None else backend, device)

    # ------------------------------------------------------------------ state and checks
    def zero_state(self, batch: int, *, device: torch.device | str | None = None) -> LayeredState:
        device = self.embedding.weight.device if device is None else device
        return self.state_cls.zeros_for(self.config, batch, device=device)

    def state_decays(self) -> dict[str, torch.Tensor]:
        """Per recurrent part whose decays are parameters, each entry's decay rate per token at zero input, as
        (layers, *the part's dims after the lanes) (an entry keeps exp(-rate) of itself per token; fitted noise's
        `fit_groups: decay` groups entries by it). Empty where the decays depend on the input (the default)."""
        return {}

    def _check_state(self, state: LayeredState | None, batch: int, device: torch.device) -> LayeredState:
        want = self.zero_state(batch, device=device)
        if state is None:
            return want
        if not isinstance(state, self.state_cls):
            raise ValueError(f"state must be a {self.state_cls.__name__} or None; got {type(state).__name__}")
        state.check_like(want)
        return state

    @staticmethod
    def _check_ids(input_ids: torch.Tensor, ndim: int) -> None:
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != ndim or \
                input_ids.dtype not in (torch.int64, torch.int32):
            want = "(batch, length)" if ndim == 2 else "(batch,)"
            got = f"{input_ids.dtype} {tuple(input_ids.shape)}" if isinstance(input_ids, torch.Tensor) else \
                type(input_ids).__name__
            raise ValueError(f"input_ids must be an integer tensor of shape {want}; got {got}")

    # ------------------------------------------------------------------ forward
    def forward_hidden(self, input_ids_BL: torch.Tensor, state: LayeredState | None = None, *,
                       backend: str | None = None,
                       resets: torch.Tensor | None = None) -> tuple[torch.Tensor, LayeredState]:
        """Final hidden states (after the last norm) and the final recurrent state (with `resets`: the state of
        each row's last document)."""
        self._check_ids(input_ids_BL, 2)
        batch, length = input_ids_BL.shape
        if length == 0:
            raise ValueError("input_ids has length 0; need at least one token")
        device = input_ids_BL.device
        state = self._check_state(state, batch, device)
        resets = check_resets(resets, input_ids_BL)
        if resets is not None and not self.supports_resets:
            raise UserError(f"{type(self).__name__} cannot reset its state inside a row, so it cannot train on "
                            "documents packed into rows; use data.layout=documents")
        # Only a caller's resets reach the blocks: an architecture without them keeps its signature.
        extra = {} if resets is None else {"resets": resets}
        use_kernels = self._use_kernels(device, backend)
        carry = self.start(self.embedding(input_ids_BL))
        finals = []
        for i, block in enumerate(self.layers):
            carry, parts = block(carry, state.layer(i), use_kernels=use_kernels, **extra)
            finals.append(parts)
        return self.finish(carry), self.state_cls.from_layers(finals)

    @property
    def head_rows(self) -> int:
        """The head's rows that are scored: the whole padded head with score_padded_vocab, else vocab_size."""
        return self.lm_head.weight.shape[0] if self.score_padded_vocab else self.config.vocab_size

    def logits_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        # Rows past vocab_size are padding and never targets. Dropping them from the weight (a contiguous
        # view of its first rows) rather than from the logits keeps the logits contiguous; on CPU
        # _HeadRows also spares the backward a zero-filled copy of the weight's gradient.
        weight = self.lm_head.weight
        rows = self.head_rows
        if (rows < weight.shape[0] and hidden.device.type == "cpu" and hidden.is_contiguous()
                and hidden.dtype == weight.dtype and not torch.is_autocast_enabled("cpu")):
            return _HeadRows.apply(hidden, weight, rows)
        return F.linear(hidden, weight[:rows])

    def forward(self, input_ids: torch.Tensor, state: LayeredState | None = None, *, backend: str | None = None,
                resets: torch.Tensor | None = None) -> tuple[torch.Tensor, LayeredState]:
        """(batch, length) token ids [+ initial state] [+ resets] -> logits (batch, length, vocab), final state."""
        hidden, state = self.forward_hidden(input_ids, state, backend=backend, resets=resets)
        return self.logits_from_hidden(hidden), state

    @torch.no_grad()
    def step(self, input_ids_B: torch.Tensor, state: LayeredState | None = None) -> tuple[torch.Tensor, LayeredState]:
        """One token per row: (batch,) ids -> logits (batch, vocab), next state. For generation."""
        self._check_ids(input_ids_B, 1)
        state = self._check_state(state, input_ids_B.shape[0], input_ids_B.device)
        carry = self.start(self.embedding(input_ids_B))
        finals = []
        for i, block in enumerate(self.layers):
            carry, parts = block.step(carry, state.layer(i))
            finals.append(parts)
        return self.logits_from_hidden(self.finish(carry)), self.state_cls.from_layers(finals)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # ------------------------------------------------------------------ checkpoints
    @classmethod
    def from_pretrained(cls, path_or_hub_id: str, *, backend: str = "auto", device: str | torch.device | None = None,
                        dtype: torch.dtype = torch.float32) -> StatefulLM:
        """Load a directory (config.json + weights) in the official format or in transformers' (where the
        architecture has one), a hub id from the local cache, or a weights file of the architecture's own release
        format (where it has one: `weights_file`), also as `owner/name/file` from the local cache."""
        path = resolve_hub_file(str(path_or_hub_id)) or Path(str(path_or_hub_id)).expanduser()
        if path.is_file():
            if cls.weights_file is None or not cls.weights_file.handles(path):
                what = f"a {cls.weights_file.suffix} file" if cls.weights_file else "a checkpoint directory"
                raise UserError(f"{path} is a file; {cls.__name__} loads {what} or a directory holding config.json")
            config, state_dict = cls.weights_file.load(path)
            model = cls(config, backend=backend)
            official.load_strict(model, state_dict, cls.official, source=str(path))
            return model.to(device=device, dtype=dtype)
        directory = resolve_pretrained_dir(str(path_or_hub_id))
        if cls.transformers is not None and cls.transformers.recognises(official.read_official_json(directory)):
            config, state_dict = transformers_format.read(directory, cls, cls.transformers)
        else:
            config = official.read_config(directory, cls.config_cls)
            state_dict = official.read_state_dict(directory, cls.official)
        model = cls(config, backend=backend)
        official.load_strict(model, state_dict, cls.official, source=str(directory))
        return model.to(device=device, dtype=dtype)

    def save_pretrained(self, directory: str, *, dtype: torch.dtype = torch.float32,
                        weights: str | None = None) -> None:
        """Write config.json + the weights in the architecture's official layout (weights: 'safetensors', 'bin', or
        None for the format's own file)."""
        official.save(self, directory, self.official, dtype=dtype, weights=weights)


__all__ = ["StatefulLM"]
