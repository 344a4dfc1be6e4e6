"""Documents packed into one row: where the carried state is reset inside a row, in the forms the scans use.

    logits, state = model(ids_BL, state, resets=resets_BL)

`resets_BL` is a (batch, length) bool tensor, True at each position whose token starts a new document: the position
sees exactly what the first token of a fresh sequence sees (every part of the state zero: the recurrence, its frame,
the conv windows and token shifts). The final state is then the state of the row's last document. A flag at
position 0 zeroes the state handed in for that row.

The chunked scans do not loop over documents: a reset cuts every decay that crosses it, i.e. a pair (t, s), s < t,
interacts only when no flag lies in (s, t]. Inside a chunk that is a comparison of the running count of flags;
across chunks the state entering a chunk survives only up to the chunk's first flag. The kernels take the same
boundaries as mamba-ssm's `seq_idx` (a document index per position) or fla's `cu_seqlens` (the rows flattened into one
sequence of documents, `Varlen`).

Legend: B batch, L length, c chunks, l / s chunk positions, N documents of all rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


def check_resets(resets: torch.Tensor | None, input_ids_BL: torch.Tensor) -> torch.Tensor | None:
    """A (batch, length) bool tensor on the ids' device, or a ValueError naming what is wrong."""
    if resets is None:
        return None
    if not isinstance(resets, torch.Tensor) or resets.dtype != torch.bool or tuple(resets.shape) != \
            tuple(input_ids_BL.shape):
        got = f"{resets.dtype} {tuple(resets.shape)}" if isinstance(resets, torch.Tensor) else type(resets).__name__
        raise ValueError(f"resets must be a bool tensor of the ids' shape {tuple(input_ids_BL.shape)} (True where a "
                         f"document starts); got {got}")
    if resets.device != input_ids_BL.device:
        raise ValueError(f"resets is on {resets.device} but the ids are on {input_ids_BL.device}")
    return resets


def document_age(resets_BL: torch.Tensor, cap: int) -> torch.Tensor:
    """(B, L) long: how many positions back the position's document starts (0 at a flag), at most `cap` (also where
    no flag precedes: the carried state then belongs to the document)."""
    length = resets_BL.shape[1]
    pos = torch.arange(length, device=resets_BL.device).expand_as(resets_BL)
    start = torch.where(resets_BL, pos, torch.full_like(pos, -cap)).cummax(dim=1).values
    return (pos - start).clamp(max=cap)


def chunk_counts(resets_BL: torch.Tensor, pad: int, chunk: int) -> torch.Tensor:
    """(B, c, l) long: flags so far in each chunk, the flag at the position included (the end padded without flags).

    Positions s <= t of one chunk share a document where the counts agree; a position reads the state that entered
    its chunk where its count is 0; a chunk passes the entering state on where its last count is 0."""
    flags = F.pad(resets_BL, (0, pad)) if pad else resets_BL
    return flags.view(flags.shape[0], -1, chunk).long().cumsum(dim=-1)


def same_document(counts_Bcl: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, c, l, s) 0/1: positions l and s of a chunk in one document (for s <= l; the scans mask s > l anyway)."""
    return (counts_Bcl.unsqueeze(-1) == counts_Bcl.unsqueeze(-2)).to(dtype)


def seq_idx(resets_BL: torch.Tensor) -> torch.Tensor:
    """(B, L) int32 document index per position (mamba-ssm's `seq_idx`): the state handed in belongs to document 0,
    so a flag at position 0 drops it."""
    return resets_BL.int().cumsum(dim=1, dtype=torch.int32)


@dataclass(frozen=True)
class Varlen:
    """The rows flattened into one sequence of documents, as fla's and mamba-ssm's varlen kernels take them
    (`cu_seqlens`, batch 1): every row start and every flag starts a document."""

    cu_seqlens: torch.Tensor
    """(N + 1,) long: where each document starts in the flattened row, then B L."""
    first: torch.Tensor
    """(B,) long: each row's first document (the one the row's handed-in state continues)."""
    last: torch.Tensor
    """(B,) long: each row's last document (whose final state is the row's)."""
    keep: torch.Tensor
    """(B,) bool: the row's first document continues the handed-in state (no flag at position 0)."""

    @classmethod
    def of(cls, resets_BL: torch.Tensor) -> Varlen:
        batch, length = resets_BL.shape
        starts_BL = resets_BL.clone()
        starts_BL[:, 0] = True
        flat = starts_BL.flatten().nonzero().squeeze(1)  # one host sync: the number of documents
        end = torch.tensor([batch * length], device=flat.device, dtype=flat.dtype)
        per_row = starts_BL.sum(dim=1)
        last = per_row.cumsum(dim=0) - 1
        return cls(torch.cat([flat, end]), last - per_row + 1, last, ~resets_BL[:, 0])

    @property
    def count(self) -> int:
        return self.cu_seqlens.shape[0] - 1

    def initial(self, state_BX: torch.Tensor) -> torch.Tensor:
        """(N, ...) initial states: the row's handed-in state for its first document (zero where it is flagged),
        zero for the others (autograd flows back into the handed-in state)."""
        kept = state_BX * self.keep.view(-1, *([1] * (state_BX.dim() - 1))).to(state_BX.dtype)
        zeros = state_BX.new_zeros(self.count, *state_BX.shape[1:])
        return zeros.index_copy(0, self.first, kept)

    @staticmethod
    def flatten(t_BLX: torch.Tensor) -> torch.Tensor:
        """(B, L, ...) -> (1, B L, ...)."""
        return t_BLX.reshape(1, -1, *t_BLX.shape[2:])


__all__ = ["Varlen", "check_resets", "chunk_counts", "document_age", "same_document", "seq_idx"]
