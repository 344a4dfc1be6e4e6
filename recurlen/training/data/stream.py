"""Token reading: documents joined by EOS as a virtual array, the train batch of any step, held-out data.

Legend: B lanes of this rank, T seq_len, S length of an epoch stream, G global lanes.
"""

from __future__ import annotations

import numpy as np
import torch

from recurlen.training.data import lanes as L
from recurlen.training.data.corpus import Corpus
from recurlen.training.data.packed import document_start_before, document_starts, packed_fields


class DocStream:
    """Documents in a given order, each followed by one EOS, read at any offset without materialising it."""

    def __init__(self, corpus: Corpus, doc_ids: np.ndarray, eos_id: int) -> None:
        # The corpus, not its token array: a cached corpus pickles as its path (spawned DataLoader workers).
        self.corpus, self.eos_id = corpus, eos_id
        self.starts = corpus.offsets[doc_ids]
        self.lens = corpus.offsets[doc_ids + 1] - self.starts
        self.cum = np.zeros(len(doc_ids) + 1, dtype=np.int64)  # stream offset of each document's start
        np.cumsum(self.lens + 1, out=self.cum[1:])
        self.length = int(self.cum[-1])

    def read(self, starts: np.ndarray, length: int) -> np.ndarray:
        """(len(starts), length) int64: stream[s:s + length] for each start s (binary search, no scan)."""
        starts = np.asarray(starts, dtype=np.int64)
        assert starts.size == 0 or (starts.min() >= 0 and starts.max() + length <= self.length), "read past the end"
        out = np.empty((len(starts), length), dtype=np.int64)
        docs = np.searchsorted(self.cum, starts, side="right") - 1
        offs = starts - self.cum[docs]
        tokens = self.corpus.tokens
        for row, (doc, off) in enumerate(zip(docs.tolist(), offs.tolist())):
            if off + length <= self.lens[doc]:  # inside one document: a single slice
                begin = self.starts[doc] + off
                out[row] = tokens[begin:begin + length]
            else:
                self._read_across(out[row], doc, off)
        return out

    def _read_across(self, dst: np.ndarray, doc: int, off: int) -> None:
        pos = 0
        while pos < len(dst):
            take = min(int(self.lens[doc]) - off, len(dst) - pos)
            if take > 0:
                begin = self.starts[doc] + off
                dst[pos:pos + take] = self.corpus.tokens[begin:begin + take]
                pos += take
            if pos < len(dst):
                dst[pos] = self.eos_id
                pos += 1
            doc, off = doc + 1, 0


class EpochStreams:
    """The epoch streams of the training documents (shuffled per epoch); the last two are kept."""

    def __init__(self, corpus: Corpus, doc_ids: np.ndarray, *, seed: int, eos_id: int) -> None:
        self.corpus, self.doc_ids, self.seed, self.eos_id = corpus, doc_ids, seed, eos_id
        self.length = int((corpus.offsets[doc_ids + 1] - corpus.offsets[doc_ids]).sum()) + len(doc_ids)
        self._cache: dict[int, DocStream] = {}

    def __call__(self, epoch: int) -> DocStream:
        if epoch not in self._cache:
            if len(self._cache) >= 2:
                del self._cache[min(self._cache)]
            order = L.doc_order(self.seed, epoch, len(self.doc_ids))
            self._cache[epoch] = DocStream(self.corpus, self.doc_ids[order], self.eos_id)
        return self._cache[epoch]


class DocumentSegments:
    """The documents layout's segments (lanes.py): which document and which of its segments each index of an
    epoch's segment sequence is, and their tokens. The cumulative counts of the last two epochs are kept."""

    def __init__(self, corpus: Corpus, doc_ids: np.ndarray, *, seq_len: int, seed: int, eos_id: int) -> None:
        self.corpus, self.doc_ids, self.seq_len, self.seed, self.eos_id = corpus, doc_ids, seq_len, seed, eos_id
        self.lens = corpus.offsets[doc_ids + 1] - corpus.offsets[doc_ids]
        self.counts = L.document_segments(self.lens, seq_len)
        self.total = int(self.counts.sum())
        self._cum: dict[int, np.ndarray] = {}

    def _first_segments(self, epoch: int) -> np.ndarray:
        """Index of each document's first segment in `epoch`'s sequence (documents in the epoch's order), then M."""
        if epoch not in self._cum:
            if len(self._cum) >= 2:
                del self._cum[min(self._cum)]
            cum = np.zeros(len(self.doc_ids) + 1, dtype=np.int64)
            np.cumsum(self.counts[L.doc_order(self.seed, epoch, len(self.doc_ids))], out=cum[1:])
            self._cum[epoch] = cum
        return self._cum[epoch]

    def locate(self, epoch: int, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(position in the training documents, segment within that document) of each segment index."""
        cum = self._first_segments(epoch)
        pos = np.searchsorted(cum, index, side="right") - 1  # empty documents share their start with the next
        order = L.doc_order(self.seed, epoch, len(self.doc_ids))
        return order[pos], index - cum[pos]

    def read(self, docs: np.ndarray, segments: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(B, T + 1) tokens of each document's segment, and (B, T) whether each target is scored: the tokens are
        the document followed by its EOS; a tail segment is padded with EOS after that, unscored."""
        T = self.seq_len
        rows = np.full((len(docs), T + 1), self.eos_id, dtype=np.int64)
        mask = np.zeros((len(docs), T), dtype=bool)
        tokens, offsets = self.corpus.tokens, self.corpus.offsets
        for row, (doc, k) in enumerate(zip(docs.tolist(), segments.tolist())):
            begin, left = int(offsets[self.doc_ids[doc]]) + k * T, int(self.lens[doc]) - k * T
            take = min(T + 1, left)  # document tokens; if fewer than T + 1, its EOS follows them
            rows[row, :take] = tokens[begin:begin + take]
            mask[row, :min(T, left)] = True  # targets up to and including the EOS
        return rows, mask


class TrainSampler:
    """The training batch of this rank's lanes at any step; the same step always gives the same batch."""

    def __init__(self, corpus: Corpus, train_ids: np.ndarray, *, lanes: np.ndarray, num_global_lanes: int,
                 seq_len: int, layout: str, seed: int, eos_id: int) -> None:
        if len(train_ids) == 0:
            raise ValueError("no training documents: every document is held out; lower val_fraction")
        self.lanes, self.num_global_lanes = lanes, num_global_lanes
        self.seq_len, self.layout, self.seed, self.eos_id = seq_len, layout, seed, eos_id
        self.streams = EpochStreams(corpus, train_ids, seed=seed, eos_id=eos_id)
        if layout == "documents":
            self.documents = DocumentSegments(corpus, train_ids, seq_len=seq_len, seed=seed, eos_id=eos_id)
            self.lane_segments = self.documents.total // num_global_lanes
            if self.lane_segments < 1:
                raise ValueError(
                    f"the training split has {self.documents.total} segments of seq_len = {seq_len} tokens (each "
                    f"document's tail counted as one) but layout='documents' with {num_global_lanes} global lanes "
                    "needs at least one per lane; use more data, fewer lanes or a shorter seq_len")
        total = self.streams.length
        self.span = L.lane_span(total, num_global_lanes)
        self.num_slots = (total - 1) // seq_len
        if layout in ("contiguous", "packed") and self.span < seq_len + 1:
            raise ValueError(
                f"the training split has {total} tokens (EOS included) but layout={layout!r} with "
                f"{num_global_lanes} global lanes x (seq_len + 1 = {seq_len + 1}) needs at least "
                f"{num_global_lanes * (seq_len + 1)}; use more data, fewer lanes, a shorter seq_len, or "
                "layout='independent'")
        if self.num_slots < 1:
            raise ValueError(f"the training split has {total} tokens (EOS included), fewer than seq_len + 1 = "
                             f"{seq_len + 1}; use more data or a shorter seq_len")

    def segments(self, step: int) -> np.ndarray:
        """(B, T + 1) int64 tokens of each lane's segment at `step`."""
        if step < 0:
            raise ValueError(f"step={step} is negative; steps count from 0")
        if self.layout == "documents":
            return self._document_batch(step)[0]
        rows = np.empty((len(self.lanes), self.seq_len + 1), dtype=np.int64)
        if self.layout in ("contiguous", "packed"):
            col = 0
            for piece in L.contiguous_pieces(step, seq_len=self.seq_len, span=self.span):
                if piece.offset == L.EOS_PIECE:
                    rows[:, col] = self.eos_id
                else:
                    starts = self.lanes * self.span + piece.offset
                    rows[:, col:col + piece.length] = self.streams(piece.epoch).read(starts, piece.length)
                col += piece.length
            return rows
        epochs, starts = L.independent_segments(step, self.lanes, seed=self.seed, num_slots=self.num_slots,
                                                num_global_lanes=self.num_global_lanes, seq_len=self.seq_len)
        for epoch in np.unique(epochs):
            sel = epochs == epoch
            rows[sel] = self.streams(int(epoch)).read(starts[sel], self.seq_len + 1)
        return rows

    def _document_batch(self, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(tokens (B, T + 1), loss mask (B, T), segment within its document (B,), new stream (B,)) at `step`."""
        if step < 0:
            raise ValueError(f"step={step} is negative; steps count from 0")
        epoch, index, slice_start = L.document_lane_segments(step, self.lanes, lane_segments=self.lane_segments)
        docs, segment = self.documents.locate(epoch, index)
        rows, mask = self.documents.read(docs, segment)
        return rows, mask, segment, (segment == 0) | slice_start

    def _packed_starts(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """Which of each lane's T + 1 tokens at `step` start a document or the lane's stream (packed.py), and the
        row's first document's earlier rows (its `segment`)."""
        T, span = self.seq_len, self.span
        starts = np.zeros((len(self.lanes), T + 1), dtype=bool)
        col, segment = 0, None
        for piece in L.contiguous_pieces(step, seq_len=T, span=span):
            if piece.offset == L.EOS_PIECE:  # the EOS between two epochs' slices: a stream of its own
                starts[:, col] = True
                segment = np.zeros(len(self.lanes), dtype=np.int64) if segment is None else segment
            else:
                cum = self.streams(piece.epoch).cum
                pos = self.lanes[:, None] * span + piece.offset + np.arange(piece.length)
                starts[:, col:col + piece.length] = document_starts(cum, pos)
                if piece.offset == 0:  # the lane's slice of this epoch starts (maybe inside a document)
                    starts[:, col] = True
                if segment is None:  # rows since the first document started, in the lane's own stream
                    begin = np.maximum(document_start_before(cum, pos[:, 0]) - self.lanes * span, 0)
                    segment = step - (piece.epoch * (span + 1) + begin) // T
            col += piece.length
        return starts, segment

    def batch(self, step: int) -> dict[str, torch.Tensor]:
        if self.layout == "documents":
            rows, mask, segment, new = self._document_batch(step)
            return make_batch(rows, lanes=self.lanes, step=step, new_stream=new, loss_mask=mask, segment=segment)
        if self.layout == "packed":
            starts, segment = self._packed_starts(step)
            return make_batch(self.segments(step), lanes=self.lanes, step=step, segment=segment,
                              **packed_fields(starts))
        return make_batch(self.segments(step), lanes=self.lanes, step=step,
                          new_stream=L.new_stream(step, self.layout))


def make_batch(segments: np.ndarray, *, lanes: np.ndarray, step: int, new_stream: bool | np.ndarray,
               loss_mask: np.ndarray | None = None, segment: np.ndarray | None = None,
               resets: np.ndarray | None = None) -> dict[str, torch.Tensor]:
    """The batch contract: input_ids / targets (B, T), lane (B,), new_stream (B,), step (); the documents layout
    adds loss_mask (B, T) (a tail's padding is not scored) and segment (B,) (index within the row's document); the
    packed layout loss_mask, segment and resets (B, T) (where a document starts, packed.py)."""
    seg = torch.from_numpy(segments)
    batch = {
        "input_ids": seg[:, :-1].contiguous(),
        "targets": seg[:, 1:].contiguous(),
        "lane": torch.as_tensor(lanes, dtype=torch.long).clone(),
        "new_stream": torch.as_tensor(np.broadcast_to(new_stream, (len(segments),)).copy(), dtype=torch.bool),
        "step": torch.tensor(step, dtype=torch.long),
    }
    if loss_mask is not None:
        batch["loss_mask"] = torch.from_numpy(loss_mask)
    if segment is not None:
        batch["segment"] = torch.as_tensor(segment, dtype=torch.long).clone()
    if resets is not None:
        batch["resets"] = torch.from_numpy(np.ascontiguousarray(resets))
    return batch


class HeldOut:
    """Held-out documents in hash order: fixed validation segments and long sequences, the same every run."""

    def __init__(self, corpus: Corpus, heldout_ids: np.ndarray, *, eos_id: int, val_fraction: float) -> None:
        if len(heldout_ids) == 0:
            raise ValueError(
                f"val_fraction={val_fraction} held out none of the {corpus.num_documents} documents; raise "
                "val_fraction, or set val_segments=0 and val_sequences=0 to train without validation data")
        self.corpus, self.ids = corpus, heldout_ids
        self.stream = DocStream(corpus, heldout_ids, eos_id)
        self.lens = self.stream.lens

    def segments(self, num: int, seq_len: int) -> np.ndarray:
        """(num, T + 1): segments spread evenly over the held-out stream (overlapping only if it is short)."""
        last = self.stream.length - (seq_len + 1)
        if last < 0:
            raise ValueError(f"the held-out documents hold {self.stream.length} tokens (EOS included), fewer than "
                             f"seq_len + 1 = {seq_len + 1}; raise val_fraction or lower seq_len")
        starts = np.linspace(0, last, num).round().astype(np.int64) if num > 1 else np.zeros(num, np.int64)
        return self.stream.read(starts, seq_len + 1)

    def long_sequences(self, num: int, length: int, mode: str) -> np.ndarray:
        """(num, length): 'first' = start of the first `num` held-out documents with >= length tokens (hash
        order); 'pack' = the held-out stream (documents joined with EOS) cut into `num` pieces."""
        if mode == "pack":
            if num * length > self.stream.length:
                raise ValueError(
                    f"val_mode='pack' needs {num} x {length} = {num * length} held-out tokens but the "
                    f"{len(self.ids)} held-out documents hold {self.stream.length} (EOS included); lower "
                    "val_length or val_sequences, or raise val_fraction")
            return self.stream.read(np.arange(num, dtype=np.int64) * length, length)
        if mode == "windows":
            return self._windows(num, length)
        if mode != "first":
            raise ValueError(f"val_mode={mode!r} is not supported; allowed: ['first', 'pack', 'windows']")
        long_enough = np.flatnonzero(self.lens >= length)
        if len(long_enough) < num:
            raise ValueError(
                f"val_mode='first' needs {num} held-out documents of at least val_length={length} tokens but "
                f"found {len(long_enough)} among {len(self.ids)} held-out documents (the longest has "
                f"{int(self.lens.max())} tokens); lower val_length or val_sequences, use val_mode='pack', or "
                "raise val_fraction")
        return self.stream.read(self.stream.cum[long_enough[:num]], length)

    def _windows(self, num: int, length: int) -> np.ndarray:
        """Non-overlapping windows inside single documents, round-robin over documents (every document's
        first window, then every second window, ...): many sequences from a small held-out set, each one
        running text of one document, spread over as many documents as possible."""
        per_doc = self.lens // length
        if int(per_doc.sum()) < num:
            raise ValueError(
                f"val_mode='windows' needs {num} windows of {length} tokens but the {len(self.ids)} held-out "
                f"documents hold {int(per_doc.sum())}; lower val_length or val_sequences, or raise val_fraction")
        starts = []
        for k in range(int(per_doc.max())):
            for d in np.flatnonzero(per_doc > k):
                starts.append(int(self.stream.cum[d]) + k * length)
                if len(starts) == num:
                    return self.stream.read(np.asarray(starts, dtype=np.int64), length)
        raise AssertionError("unreachable: enough windows were counted")


__all__ = ["DocStream", "EpochStreams", "HeldOut", "TrainSampler", "make_batch"]
