"""Token reading: documents joined by EOS as a virtual array, the train batch of any step, held-out data.

Legend: B lanes of this rank, T seq_len, S length of an epoch stream, G global lanes.
"""

from __future__ import annotations

import numpy as np
import torch

from recurlen.training.data import lanes as L
from recurlen.training.data.corpus import Corpus


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


class TrainSampler:
    """The training batch of this rank's lanes at any step; the same step always gives the same batch."""

    def __init__(self, corpus: Corpus, train_ids: np.ndarray, *, lanes: np.ndarray, num_global_lanes: int,
                 seq_len: int, layout: str, seed: int, eos_id: int) -> None:
        if len(train_ids) == 0:
            raise ValueError("no training documents: every document is held out; lower val_fraction")
        self.lanes, self.num_global_lanes = lanes, num_global_lanes
        self.seq_len, self.layout, self.seed, self.eos_id = seq_len, layout, seed, eos_id
        self.streams = EpochStreams(corpus, train_ids, seed=seed, eos_id=eos_id)
        total = self.streams.length
        self.span = L.lane_span(total, num_global_lanes)
        self.num_slots = (total - 1) // seq_len
        if layout == "contiguous" and self.span < seq_len + 1:
            raise ValueError(
                f"the training split has {total} tokens (EOS included) but layout='contiguous' with "
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
        rows = np.empty((len(self.lanes), self.seq_len + 1), dtype=np.int64)
        if self.layout == "contiguous":
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

    def batch(self, step: int) -> dict[str, torch.Tensor]:
        return make_batch(self.segments(step), lanes=self.lanes, step=step,
                          new_stream=L.new_stream(step, self.layout))


def make_batch(segments: np.ndarray, *, lanes: np.ndarray, step: int, new_stream: bool) -> dict[str, torch.Tensor]:
    """The batch contract: input_ids / targets (B, T), lane (B,), new_stream (B,), step ()."""
    seg = torch.from_numpy(segments)
    return {
        "input_ids": seg[:, :-1].contiguous(),
        "targets": seg[:, 1:].contiguous(),
        "lane": torch.as_tensor(lanes, dtype=torch.long).clone(),
        "new_stream": torch.full((len(segments),), new_stream, dtype=torch.bool),
        "step": torch.tensor(step, dtype=torch.long),
    }


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
