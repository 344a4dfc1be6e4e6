"""The packed layout: the contiguous layout's rows (a lane's EOS-joined stream of documents, T tokens a step) with
each document's start flagged, so that the model resets its state there (recurlen.models.resets).

    resets     (B, T) bool   True where the input token starts a document (or a lane's stream: its slice of an
                             epoch, or the EOS between two epochs' slices). Column 0 equals new_stream: whether the
                             row starts anew is the intervention's to decide (TBTT starts it from zeros), the model
                             resets the columns after it.
    loss_mask  (B, T) bool   False where the target starts a document: the input there is the previous document's
                             EOS (or the lane's EOS between epochs), and no document predicts its first token, as in
                             the documents layout; the only unscored positions (one per document, and the end).
    segment    (B,)   long   how many earlier rows the row's first document spans (0: the row starts it), for
                             tbptt_segments, as the documents layout's segment within the document.

Every document is read from zeros, its tokens and its EOS as targets, with T-token rows and no padding: a row holds
the continuation of the document the lane's previous row ended in, the documents after it, and the start of the next.
Where lanes stand is the contiguous layout's (lanes.py, source_lanes.py): a pure function of (seed, step, rank, world
size), so resume is exact.
"""

from __future__ import annotations

import numpy as np


def document_starts(cum: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Whether each stream position starts a document (`cum`: each document's start in the stream, then its length)."""
    idx = np.searchsorted(cum, positions)
    found = np.minimum(idx, len(cum) - 1)
    return (idx < len(cum) - 1) & (cum[found] == positions)


def document_start_before(cum: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The start of the document holding each stream position."""
    return cum[np.searchsorted(cum, positions, side="right") - 1]


def packed_fields(starts: np.ndarray) -> dict[str, np.ndarray]:
    """make_batch's new_stream, loss_mask and resets from which of a step's (B, T + 1) tokens start a document or a
    lane's stream."""
    return {"new_stream": starts[:, 0].copy(), "loss_mask": np.ascontiguousarray(~starts[:, 1:]),
            "resets": np.ascontiguousarray(starts[:, :-1])}


__all__ = ["document_start_before", "document_starts", "packed_fields"]
