"""Where every lane stands at every step: pure functions of (seed, step, lane), no data, no history.

Terms:
    epoch stream   all training documents in the epoch's shuffled order, each followed by one EOS;
                   it has the same length S every epoch (same documents, different order)
    global lane g  one batch row across all ranks, 0 <= g < G = batch_size * world_size;
                   rank r owns lanes [r * batch_size, (r + 1) * batch_size)
    step           the micro-step (one batch per rank per step)

contiguous: lane g owns the slice [g * C, (g + 1) * C) of every epoch stream, C = S // G ("lane span").
    Its own stream is that slice of epoch 0, one EOS, the slice of epoch 1, one EOS, ... and segment k is
    its tokens [k * T, k * T + T + 1): segment k + 1 starts right where segment k's inputs end. Equal spans
    make every lane's epoch the same length, so locating a step never needs past epochs or steps.
independent: the epoch stream is cut into M = (S - 1) // T slots of T + 1 tokens (starting every T
    tokens); slot i of the infinite sequence "epoch 0's slots shuffled, epoch 1's slots shuffled, ..."
    goes to (step, lane) = divmod(i, G). Each epoch visits every slot once.
documents: every document (its tokens, then its EOS as the last target) is cut into n_d = ceil(len_d / T)
    segments of T inputs; the last one ("tail") holds the rest of the document and is padded, its padding
    unscored. The epoch's segment sequence is every document's segments in the epoch's document order; it has
    the same length M every epoch, and lane g owns its slice [g * K, (g + 1) * K), K = M // G ("lane segments"):
    at step s the lane reads segment g * K + s % K of epoch s // K. A lane walks its documents segment by segment
    (TBTT carries the state); it starts from zeros where a document starts and where its slice begins (the
    slice may begin inside a document whose first segments belong to the lane before it).
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np

_DOC_ORDER, _SLOT_ORDER = 0, 1  # separate random streams for the two permutations
EOS_PIECE = -1


class Piece(NamedTuple):
    epoch: int
    offset: int
    """Offset within the lane's span of this epoch's stream, or EOS_PIECE for the EOS after the span."""
    length: int


def global_lanes(rank: int, world_size: int, batch_size: int) -> np.ndarray:
    """The global lanes rank `rank` reads; ranks never share one and together cover all G lanes."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} is out of range for world_size={world_size}; need 0 <= rank < world_size")
    return np.arange(rank * batch_size, (rank + 1) * batch_size, dtype=np.int64)


def _permutation(seed: int, epoch: int, n: int, kind: int) -> np.ndarray:
    order = np.random.default_rng([seed, epoch, kind]).permutation(n)
    order.flags.writeable = False
    return order


@lru_cache(maxsize=4)
def doc_order(seed: int, epoch: int, num_docs: int) -> np.ndarray:
    """Order of the training documents in `epoch`'s stream (read-only)."""
    return _permutation(seed, epoch, num_docs, _DOC_ORDER)


@lru_cache(maxsize=4)
def slot_order(seed: int, epoch: int, num_slots: int) -> np.ndarray:
    """Order in which the independent layout visits `epoch`'s slots (read-only)."""
    return _permutation(seed, epoch, num_slots, _SLOT_ORDER)


def lane_span(stream_length: int, num_global_lanes: int) -> int:
    return stream_length // num_global_lanes


def contiguous_pieces(step: int, *, seq_len: int, span: int) -> list[Piece]:
    """Segment `step` of every lane as pieces of epoch streams; lane g reads offset o at g * span + o.

    The pieces are the same for all lanes (all spans are equally long); a segment crossing an epoch
    boundary has two or three pieces (the EOS between epochs is one).
    """
    period = span + 1  # the span, then the EOS that marks the jump to the next epoch's span
    pos, end = step * seq_len, step * seq_len + seq_len + 1
    pieces = []
    while pos < end:
        epoch, offset = divmod(pos, period)
        if offset == span:
            pieces.append(Piece(epoch, EOS_PIECE, 1))
            pos += 1
        else:
            length = min(span - offset, end - pos)
            pieces.append(Piece(epoch, offset, length))
            pos += length
    return pieces


def independent_segments(step: int, lanes: np.ndarray, *, seed: int, num_global_lanes: int, num_slots: int,
                         seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(epoch, start in that epoch's stream) of each lane's segment at `step`; each reads seq_len + 1 tokens."""
    index = step * num_global_lanes + lanes
    epochs, within = np.divmod(index, num_slots)
    starts = np.empty_like(index)
    for epoch in np.unique(epochs):
        rows = epochs == epoch
        starts[rows] = slot_order(seed, int(epoch), num_slots)[within[rows]] * seq_len
    return epochs, starts


def document_segments(lengths: np.ndarray, seq_len: int) -> np.ndarray:
    """Segments of seq_len inputs per document of the given lengths: the tail of a document is one more
    segment (padded), a document shorter than seq_len is one segment, an empty one none."""
    return -(-np.asarray(lengths, dtype=np.int64) // seq_len)


def document_lane_segments(step: int, lanes: np.ndarray, *, lane_segments: int) -> tuple[int, np.ndarray, bool]:
    """(epoch, index in that epoch's segment sequence of each lane's segment at `step`, whether the step is the
    first of the lanes' slices in that epoch)."""
    epoch, within = divmod(step, lane_segments)
    return epoch, lanes * lane_segments + within, within == 0


def new_stream(step: int, layout: str) -> bool:
    """Whether a lane's segment at `step` does not continue its segment at step - 1."""
    return layout == "independent" or step == 0


__all__ = ["EOS_PIECE", "Piece", "contiguous_pieces", "doc_order", "document_lane_segments", "document_segments",
           "global_lanes", "independent_segments", "lane_span", "new_stream", "slot_order"]
