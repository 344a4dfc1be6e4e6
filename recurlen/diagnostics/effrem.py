"""Effective Remembrance (Buitrago Ruiz & Gu, 2025):

    EffRem_T(t) = TV( q(. | x[0:T]), q(. | x[t:T]) ),   TV(p, q) = 1/2 * sum_v |p_v - q_v|

the change in the next-token distribution at position T (the prediction of x[T]) when the first
t tokens are dropped. 0 means the model has forgotten x[0:t]; a model that length-generalizes
keeps it small for t far from T. Averaged over sequences (a plain mean per t).

t ranges over [0, T-1]: at t = T the context is empty and a Mamba model (no BOS token) has no
prediction to make, so t = T is rejected rather than given invented semantics.

Work sharing: every suffix x[t:T] ends at T, so the runs are aligned on absolute positions and
split at the grid points t_1 < t_2 < ... . In segment [t_k, t_k+1) the k active suffixes of a
sequence read the same tokens, each with its own state: they run as batch rows of one forward
call, and a suffix joins (from the zero state) at its start. The t = 0 suffix is the full-context
run itself, so q(.|x[0:T]) costs nothing extra and EffRem_T(0) is exactly 0. The total work is
sum_t (T - t) tokens per sequence (each suffix is read once; nothing else can be shared exactly,
since the suffixes' states differ), in len(grid) sequential segments instead of one run per t.

Legend: B sequences in a batch, G grid points (+ t = 0), R rows = G * B, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn as nn
from tqdm.auto import tqdm

from recurlen.diagnostics.model_access import autocast, eval_mode, model_device, require_state_api, select_sequences
from recurlen.models.state import LayeredState


def default_t_grid(context_len: int, num_points: int = 17) -> list[int]:
    """`num_points` values evenly spaced over [0, T-1], both ends included."""
    if context_len < 2:
        raise ValueError(f"EffRem needs T >= 2; got T={context_len}")
    if num_points < 2:
        raise ValueError(f"EffRem needs at least 2 grid points; got num_points={num_points}")
    last = context_len - 1
    return sorted({round(i * last / (num_points - 1)) for i in range(num_points)})


def check_t_grid(t_grid: Sequence[int], context_len: int) -> list[int]:
    """Sorted distinct ints in [0, T-1]; ValueError naming the offending values otherwise."""
    if len(t_grid) == 0:
        raise ValueError("EffRem t-grid is empty; give at least one t in [0, T-1]")
    bad_type = [t for t in t_grid if isinstance(t, bool) or int(t) != t]
    if bad_type:
        raise ValueError(f"EffRem t-grid must hold integer token counts; got {bad_type[:4]}")
    grid = sorted({int(t) for t in t_grid})
    outside = [t for t in grid if not 0 <= t <= context_len]
    if outside:
        raise ValueError(f"EffRem t-grid values {outside[:4]} lie outside [0, T] = [0, {context_len}]")
    if grid[-1] == context_len:
        raise ValueError(f"EffRem t={context_len} (= T) leaves an empty context x[T:T]; the largest usable t is "
                         f"T-1 = {context_len - 1}")
    return grid


@dataclass
class EffRemResult:
    """Sum over sequences of EffRem_T(t) for each t of the grid (ranks add sums and counts)."""

    context_len: int
    t: list[int]
    tv_sum_G: torch.Tensor
    """(G,) float64 sums over sequences of the TV distance."""
    count: int

    def mean(self) -> torch.Tensor:
        return self.tv_sum_G / self.count if self.count else torch.full_like(self.tv_sum_G, float("nan"))

    def to_dict(self) -> dict:
        return {"T": self.context_len, "t": list(self.t), "effrem": self.mean().tolist(),
                "num_sequences": self.count, "suffix_tokens_per_sequence": suffix_tokens(self.context_len, self.t)}


def suffix_tokens(context_len: int, t_grid: Sequence[int]) -> int:
    """Tokens the model reads per sequence: every suffix once, plus the full context if 0 is not in the grid."""
    starts = sorted(set(t_grid) | {0})
    return sum(context_len - t for t in starts)


@torch.no_grad()
def effrem_batch(model: nn.Module, ids_BT: torch.Tensor, t_grid: Sequence[int], *, chunk_len: int = 2048,
                 max_batch_rows: int = 64, bf16: bool = False,
                 on_tokens: Callable[[int], None] | None = None) -> torch.Tensor:
    """TV between q(.|x[0:T]) and q(.|x[t:T]) for each t of the grid and each row -> (G, B) float64."""
    batch, context_len = ids_BT.shape
    grid = check_t_grid(t_grid, context_len)
    starts = sorted(set(grid) | {0})
    bounds = [*starts, context_len]
    device = ids_BT.device
    state: LayeredState | None = None
    last_hidden_RD = None
    for k, (seg_start, seg_end) in enumerate(zip(bounds[:-1], bounds[1:])):
        # Rows are start-major (row = g * B + b), so the suffix that joins here is appended at the end.
        fresh = model.zero_state(batch)
        state = fresh if state is None else type(fresh).cat([state, fresh])
        rows = (k + 1) * batch
        for c0 in range(seg_start, seg_end, chunk_len):
            c1 = min(c0 + chunk_len, seg_end)
            ids_RL = ids_BT[:, c0:c1].repeat(k + 1, 1)
            hiddens, states = [], []
            for r0 in range(0, rows, max_batch_rows):
                with autocast(device, bf16=bf16):
                    hidden_RLD, state_r = model.forward_hidden(ids_RL[r0:r0 + max_batch_rows],
                                                               state[r0:r0 + max_batch_rows])
                hiddens.append(hidden_RLD[:, -1])
                states.append(state_r)
            state = states[0] if len(states) == 1 else type(states[0]).cat(states)
            last_hidden_RD = torch.cat(hiddens)
            if on_tokens is not None:
                on_tokens(rows * (c1 - c0))
    with autocast(device, bf16=bf16):
        logits_RV = model.logits_from_hidden(last_hidden_RD)
    # float64 probabilities: the TV sums |p - q| over the whole vocabulary (50k terms for the Pile models).
    probs_GBV = torch.softmax(logits_RV.double(), dim=-1).view(len(starts), batch, -1)
    tv_GB = 0.5 * (probs_GBV - probs_GBV[0]).abs().sum(dim=-1)
    keep = torch.tensor([starts.index(t) for t in grid], device=tv_GB.device)
    return tv_GB.index_select(0, keep).clamp_(0.0, 1.0)


def effective_remembrance(model: nn.Module, sequences: torch.Tensor | Sequence[torch.Tensor], *, context_len: int,
                          t_grid: Sequence[int] | None = None, num_points: int = 17, num_sequences: int | None = None,
                          train_len: int | None = None, chunk_len: int = 2048, batch_size: int = 8,
                          max_batch_rows: int = 64, bf16: bool = False, progress: bool | str = False) -> EffRemResult:
    """EffRem_T(t) averaged over held-out sequences (the first `num_sequences` with >= T tokens).

    context_len is T; train_len, when given, must be smaller than T (the diagnostic is about
    contexts beyond training). t_grid defaults to `num_points` evenly spaced values in [0, T-1].
    progress: a progress bar; a str is its label.
    """
    require_state_api(model)
    if train_len is not None and context_len <= train_len:
        raise ValueError(f"EffRem: T={context_len} must be larger than the training context train_len={train_len} "
                         f"(the paper uses T = 4x the training context)")
    grid = check_t_grid(t_grid, context_len) if t_grid is not None else default_t_grid(context_len, num_points)
    if batch_size < 1 or max_batch_rows < 1:
        raise ValueError(f"EffRem: batch_size and max_batch_rows must be >= 1; got {batch_size}, {max_batch_rows}")
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    seqs_NT = select_sequences(sequences, length=context_len, num=num_sequences, what="EffRem", vocab_size=vocab)
    device = model_device(model)
    tv_sum_G = torch.zeros(len(grid), dtype=torch.float64)
    total = seqs_NT.shape[0] * suffix_tokens(context_len, grid)
    label = progress if isinstance(progress, str) else "EffRem"
    with eval_mode(model), tqdm(total=total, disable=not progress, desc=label, unit="tok", unit_scale=True,
                                leave=False) as bar:
        for first in range(0, seqs_NT.shape[0], batch_size):
            ids_BT = seqs_NT[first:first + batch_size].to(device)
            tv_GB = effrem_batch(model, ids_BT, grid, chunk_len=chunk_len, max_batch_rows=max_batch_rows,
                                 bf16=bf16, on_tokens=bar.update)
            tv_sum_G += tv_GB.sum(dim=1).cpu()
    return EffRemResult(context_len, grid, tv_sum_G, seqs_NT.shape[0])
