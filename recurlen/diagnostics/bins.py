"""Position bins and split points for position-wise evaluation.

Positions are *prediction* positions: position p is the prediction of token x[p+1] made after
reading x[0..p] (p + 1 tokens of context). A held-out sequence of L tokens therefore gives
P = L - 1 predictions, p = 0 .. L-2, and a model trained on inputs of length T makes exactly the
predictions p in [0, T) during training: the first bin is the in-distribution one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class PositionBin:
    name: str
    """Stable label, e.g. "[2T,4T)" (context multiples) or "[128,256)" (log-spaced, in tokens)."""
    start: int
    """First prediction position in the bin (inclusive)."""
    end: int
    """One past the last position, clipped to the positions that were evaluated."""
    kind: str
    """"context" (multiples of the training context T) or "log" (log-spaced in tokens)."""

    @property
    def size(self) -> int:
        return self.end - self.start

    def to_dict(self) -> dict:
        return asdict(self)


def _t_label(multiple: int) -> str:
    return "0" if multiple == 0 else "T" if multiple == 1 else f"{multiple}T"


def context_bins(train_len: int, num_positions: int) -> list[PositionBin]:
    """[0,T), [T,2T), [2T,4T), ... until the positions run out; the last bin may be clipped.

    Names stay nominal ("[8T,16T)") even when clipped, so that logged tags do not change with L;
    `start` / `end` say what was actually averaged.
    """
    if train_len < 1:
        raise ValueError(f"train_len must be a positive integer; got {train_len}")
    if num_positions < 1:
        raise ValueError(f"need at least one position to bin; got num_positions={num_positions}")
    bins = [PositionBin(f"[0,{_t_label(1)})", 0, min(train_len, num_positions), "context")]
    lo = 1
    while lo * train_len < num_positions:
        hi = 2 * lo
        bins.append(PositionBin(f"[{_t_label(lo)},{_t_label(hi)})", lo * train_len,
                                min(hi * train_len, num_positions), "context"))
        lo = hi
    return bins


def log_bins(num_positions: int, num_bins: int) -> list[PositionBin]:
    """About `num_bins` log-spaced bins [0,e1), [e1,e2), ... covering every position once."""
    if num_bins < 1:
        raise ValueError(f"num_bins must be >= 1; got {num_bins}")
    if num_positions < 1:
        raise ValueError(f"need at least one position to bin; got num_positions={num_positions}")
    edges = log_points(num_positions, num_bins)
    starts = [0, *edges[:-1]]
    return [PositionBin(f"[{a},{b})", a, b, "log") for a, b in zip(starts, edges)]


def log_points(stop: int, num: int, *, start: int = 1) -> list[int]:
    """Up to `num` distinct integers, log-spaced in [start, stop], always ending at `stop`."""
    if stop < start:
        return [stop] if stop > 0 else []
    ratio = math.log(stop / start)
    points = {round(start * math.exp(ratio * i / max(num - 1, 1))) for i in range(num)}
    return sorted(p for p in points | {stop} if start <= p <= stop)


def split_points(length: int, *, chunk_len: int, extra: Iterable[int] = ()) -> list[int]:
    """Sorted chunk ends in (0, length]: the regular chunk grid plus `extra` points.

    Splitting a run anywhere is exact (split invariance), so extra points cost only one more call
    each; they are where state statistics are sampled and where the reset control zeroes the state.
    """
    if chunk_len < 1:
        raise ValueError(f"chunk_len must be a positive integer; got {chunk_len}")
    ends = set(range(chunk_len, length, chunk_len)) | {length}
    ends |= {int(p) for p in extra if 0 < int(p) < length}
    return sorted(ends)


def bin_sums(values_P: torch.Tensor, bins: Sequence[PositionBin]) -> torch.Tensor:
    """Sum of a per-position tensor (..., P) inside each bin -> (..., num_bins)."""
    return torch.stack([values_P[..., b.start:b.end].sum(dim=-1) for b in bins], dim=-1)


def bin_summary(bins: Sequence[PositionBin], nll_sum_b: torch.Tensor, count_b: torch.Tensor,
                reset_nll_sum_b: torch.Tensor | None = None) -> list[dict]:
    """Per bin: mean NLL (nats/token), perplexity, and with the reset control full - reset.

    `count_b` counts scored tokens (sequences x positions) per bin; empty bins report NaN.
    """
    rows = []
    for i, b in enumerate(bins):
        count = float(count_b[i])
        loss = float(nll_sum_b[i]) / count if count > 0 else float("nan")
        row = {**b.to_dict(), "count": int(count), "loss": loss, "ppl": perplexity(loss)}
        if reset_nll_sum_b is not None:
            reset = float(reset_nll_sum_b[i]) / count if count > 0 else float("nan")
            row.update(reset_loss=reset, reset_ppl=perplexity(reset), full_minus_reset=loss - reset)
        rows.append(row)
    return rows


def perplexity(loss: float) -> float:
    """exp(loss), inf instead of OverflowError for a diverged model (loss > ~709 nats)."""
    try:
        return math.exp(loss)
    except OverflowError:
        return float("inf")
