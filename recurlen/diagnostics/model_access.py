"""Checks and small helpers shared by the evaluations: model API, held-out sequences, autocast."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch
import torch.nn as nn

STATE_API = ("forward_hidden", "logits_from_hidden", "zero_state")


def require_state_api(model: object) -> None:
    """The evaluations run any length in chunks with the state carried; that needs recurlen's state API."""
    missing = [name for name in STATE_API if not callable(getattr(model, name, None))]
    if missing or not isinstance(model, nn.Module):
        raise ValueError(
            f"model of type {type(model).__name__} has no recurrent-state API (missing {missing or ['nn.Module']}); "
            f"recurlen's evaluations need a recurrent LM (recurlen.models.interface.RecurrentLM) with {list(STATE_API)}"
        )


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def autocast(device: torch.device, *, bf16: bool) -> contextlib.AbstractContextManager:
    """bf16 autocast on CUDA only; on CPU bf16 is slower than float32 and would only add noise."""
    if bf16 and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


@contextlib.contextmanager
def eval_mode(model: nn.Module):
    """Evaluate in eval mode and give the model back in the mode it came in (a callback runs mid-fit)."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def select_sequences(sequences: torch.Tensor | Sequence[torch.Tensor], *, length: int, num: int | None,
                     what: str, vocab_size: int | None = None) -> torch.Tensor:
    """The first `num` held-out sequences with at least `length` tokens, cut to `length` -> (num, length).

    Accepts a LongTensor (count, L0) or a list of 1-D token tensors of any lengths. Raises
    ValueError saying how many long-enough sequences were found when there are too few.
    """
    if length < 2:
        raise ValueError(f"{what}: sequence length must be >= 2 (one prediction needs two tokens); got {length}")
    if num is not None and num < 1:
        raise ValueError(f"{what}: number of sequences must be >= 1; got {num}")
    if isinstance(sequences, torch.Tensor):
        if sequences.dim() != 2:
            raise ValueError(f"{what}: held-out sequences must be a (num, length) tensor or a list of 1-D tensors; "
                             f"got a tensor of shape {tuple(sequences.shape)}")
        rows = list(sequences) if sequences.shape[1] >= length else []
        lengths = [sequences.shape[1]] * sequences.shape[0]
    else:
        seqs = [torch.as_tensor(s) for s in sequences]
        bad = [tuple(s.shape) for s in seqs if s.dim() != 1]
        if bad:
            raise ValueError(f"{what}: each held-out sequence must be a 1-D token tensor; got shapes {bad[:4]}")
        rows = [s for s in seqs if s.shape[0] >= length]
        lengths = [s.shape[0] for s in seqs]
    want = len(rows) if num is None else num
    if len(rows) < max(want, 1):
        longest = max(lengths, default=0)
        raise ValueError(
            f"{what}: need {max(want, 1)} held-out sequence(s) of at least {length} tokens; found {len(rows)} "
            f"of {len(lengths)} (the longest has {longest} tokens)"
        )
    out_NL = torch.stack([r[:length] for r in rows[:want]])
    if out_NL.dtype.is_floating_point or out_NL.dtype == torch.bool:
        raise ValueError(f"{what}: held-out sequences must hold integer token ids; got {out_NL.dtype}")
    out_NL = out_NL.long()
    if vocab_size is not None and out_NL.numel() and (int(out_NL.min()) < 0 or int(out_NL.max()) >= vocab_size):
        raise ValueError(f"{what}: token ids must lie in [0, {vocab_size}) for this model; found range "
                         f"[{int(out_NL.min())}, {int(out_NL.max())}]")
    return out_NL


def available_length(sequences: torch.Tensor | Sequence[torch.Tensor], num: int) -> int:
    """The longest length that `num` of the held-out sequences reach (what select_sequences can cut them to);
    0 when there are fewer than `num`."""
    if isinstance(sequences, torch.Tensor):
        return int(sequences.shape[-1]) if sequences.dim() == 2 and sequences.shape[0] >= num else 0
    lengths = sorted((len(s) for s in sequences), reverse=True)
    return lengths[num - 1] if num >= 1 and len(lengths) >= num else 0


def unigram_loss(seqs_NL: torch.Tensor) -> float:
    """Cross-entropy (nats / token) of the held-out targets under their own token frequencies: the best a
    model that ignores all context can do on them (the no-context baseline of `recurlen report`)."""
    targets = seqs_NL[:, 1:].reshape(-1)
    counts = torch.bincount(targets).double()
    p = counts[counts > 0] / counts.sum()
    return float(-(p * p.log()).sum())
