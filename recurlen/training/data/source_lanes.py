"""Lanes that walk the source from its start (tokenize='needed'): what a step reads never depends on how much of
the source is tokenized, so a run tokenizes only what it reads and a longer run extends the cache.

The whole-source layouts (lanes.py) shuffle all documents per epoch and spread the lanes over the whole stream:
reading a prefix would change every batch. Here:
    training documents  the documents that are not held out (same hash rule), in source order; the source's own
                        order is the shuffle (the Pile's shards are shuffled; shuffle a corpus of your own first),
                        so data.seed does not move the train lanes
    lane g              owns training documents g, g + G, g + 2G, ... (G global lanes); its stream is those
                        documents, each followed by EOS
    contiguous          segment s of lane g is its stream's tokens [s * T, s * T + T + 1): TBTT's window form
    packed              the same rows, each document's start flagged (packed.py)
    independent         the same segments, each starting from a fresh state (new_stream at every step)
    documents           lane g walks its documents segment by segment (tail padded, unscored), as in lanes.py
    held-out            the first V held-out documents in source order, V the fewest that serve val_segments and
                        val_sequences x val_length in val_mode (fixed once the cache holds them), in hash order
A lane's k-th document is training document k * G + g whatever follows it, so positions are a pure function of
(step, rank, world size) and of the source: resume needs only the step.
"""

from __future__ import annotations

import math

import numpy as np

from recurlen.training.data.config import DataConfig
from recurlen.training.data.corpus import Corpus
from recurlen.training.data.packed import document_start_before, document_starts, packed_fields
from recurlen.training.data.stream import DocStream, DocumentSegments, make_batch

MARGIN_STEPS = 8
MARGIN_FRACTION = 0.01
"""Steps tokenized past the run's last: 1% + 8. DataLoader workers prefetch up to 2 batches each past the last step
and the last optimizer step's accumulation reads all its micro-steps; a step past the cache is still read right (the
sampler extends the cache), only slower."""


def steps_to_cover(steps: int) -> int:
    return steps + MARGIN_STEPS + math.ceil(MARGIN_FRACTION * steps)


def is_heldout(doc_hash: np.ndarray, val_fraction: float) -> np.ndarray:
    threshold = min(int(val_fraction * 2**64), 2**64 - 1)
    return doc_hash < np.uint64(threshold)


def heldout_count(lengths: np.ndarray, cfg: DataConfig) -> int | None:
    """V: the fewest held-out documents (source order, these lengths) that serve the validation; None if these do
    not. 0 when the run validates on nothing."""
    if cfg.val_segments == 0 and cfg.val_sequences == 0:
        return 0
    ok = np.ones(len(lengths), dtype=bool)
    stream = np.cumsum(lengths + 1)
    if cfg.val_segments > 0:
        ok &= stream >= cfg.seq_len + 1
    if cfg.val_sequences > 0:
        num, length = cfg.val_sequences, cfg.long_val_length
        have = {"first": np.cumsum(lengths >= length), "windows": np.cumsum(lengths // length),
                "pack": stream // length}[cfg.val_mode]
        ok &= have >= num
    hits = np.flatnonzero(ok)
    return int(hits[0]) + 1 if len(hits) else None


def split(corpus: Corpus, cfg: DataConfig) -> tuple[np.ndarray, np.ndarray | None]:
    """(training document ids in source order, held-out ids in hash order or None while the cache holds too few)."""
    held = is_heldout(corpus.doc_hash, cfg.val_fraction)
    held_ids = np.flatnonzero(held)
    v = heldout_count(corpus.lengths[held_ids], cfg)
    if v is not None:
        held_ids = held_ids[:v]
        held_ids = held_ids[np.argsort(corpus.doc_hash[held_ids], kind="stable")]
    return np.flatnonzero(~held), None if v is None else held_ids


def _lane_need(lengths: np.ndarray, layout: str, seq_len: int) -> np.ndarray:
    """What each training document gives its lane: tokens (EOS included), or segments for layout='documents'."""
    return -(-lengths // seq_len) if layout == "documents" else lengths + 1


def missing_tokens(corpus: Corpus, cfg: DataConfig, *, steps: int, num_global_lanes: int) -> int:
    """Tokens (an estimate) the cache lacks for `steps` steps of every lane and for the held-out set; 0: covered."""
    train_ids, heldout = split(corpus, cfg)
    G, T = num_global_lanes, cfg.seq_len
    need = steps if cfg.layout == "documents" else steps * T + 1
    gives = _lane_need(corpus.lengths[train_ids], cfg.layout, T)
    lanes = np.zeros(G, dtype=np.int64)
    np.add.at(lanes, np.arange(len(gives)) % G, gives)
    short = int(np.maximum(need - lanes, 0).max())
    per_unit = T if cfg.layout == "documents" else 1
    # The lanes fill in turn: the shortest lane's deficit times the lanes, scaled up by the held-out share.
    missing = short * per_unit * G / max(1e-9, 1.0 - cfg.val_fraction)
    if heldout is None:
        want = max(cfg.val_sequences * cfg.long_val_length, cfg.val_segments * (T + 1), T + 1)
        # Held-out documents long enough for val_mode are not known before they are read: grow by a quarter at
        # least, so that a rare kind of document is found in a few rounds.
        missing = max(missing, want / max(cfg.val_fraction, 1e-9) - corpus.num_tokens, corpus.num_tokens * 0.25,
                      64 * T)
    return 0 if missing <= 0 else math.ceil(missing * 1.02) + T


def estimate_tokens(cfg: DataConfig, *, steps: int, num_global_lanes: int) -> int:
    """Tokens a run of `steps` steps reads (margin included) before anything is tokenized: what the dry run says."""
    T = cfg.seq_len
    # T tokens per lane and step: exact for the stream layouts, an upper bound for 'documents' (padded tails).
    train = steps_to_cover(steps) * T * num_global_lanes / max(1e-9, 1.0 - cfg.val_fraction)
    held = max(cfg.val_sequences * cfg.long_val_length, cfg.val_segments * (T + 1)) / max(cfg.val_fraction, 1e-9)
    return math.ceil(max(train, held if (cfg.val_sequences or cfg.val_segments) else 0))


class Grow:
    """Extends the cache to cover a number of steps (plus the margin) of every lane: the sampler's `grow`."""

    def __init__(self, cache, cfg: DataConfig, *, num_global_lanes: int) -> None:
        self.cache, self.cfg, self.num_global_lanes = cache, cfg, num_global_lanes

    def __call__(self, steps: int) -> Corpus:
        return self.cache.extend(lambda c: missing_tokens(c, self.cfg, steps=steps_to_cover(steps),
                                                          num_global_lanes=self.num_global_lanes))


class SourceOrderSampler:
    """The training batch of this rank's lanes at any step (the TrainSampler interface); `grow(step)` is called
    with a step the corpus does not cover yet and returns a corpus that does."""

    def __init__(self, corpus: Corpus, cfg: DataConfig, *, lanes: np.ndarray, num_global_lanes: int, eos_id: int,
                 grow=None) -> None:
        self.cfg, self.lanes, self.num_global_lanes, self.eos_id, self.grow = cfg, lanes, num_global_lanes, eos_id, grow
        self.seq_len, self.layout = cfg.seq_len, cfg.layout
        self._use(corpus)

    def _use(self, corpus: Corpus) -> None:
        self.corpus = corpus
        train_ids = split(corpus, self.cfg)[0]
        G, T = self.num_global_lanes, self.seq_len
        docs = [train_ids[g::G] for g in self.lanes.tolist()]
        if self.layout == "documents":
            self.walks = [DocumentSegments(corpus, d, seq_len=T, seed=0, eos_id=self.eos_id) for d in docs]
            self.cum = [np.concatenate([[0], np.cumsum(w.counts)]) for w in self.walks]
            self.covered = min(int(c[-1]) for c in self.cum)
        else:
            self.streams = [DocStream(corpus, d, self.eos_id) for d in docs]
            self.covered = min((s.length - 1) // T for s in self.streams)
        self.complete = bool(corpus.meta.get("complete"))

    def _ensure(self, step: int) -> None:
        if step < self.covered:
            return
        if self.grow is not None and not self.complete:
            self._use(self.grow(step + 1))
        if step >= self.covered:
            raise ValueError(f"the source ends before step {step}: its {self.corpus.num_documents} documents "
                             f"({self.corpus.num_tokens} tokens) give each of {self.num_global_lanes} lanes "
                             f"{self.covered} steps of seq_len = {self.seq_len}; use fewer steps or lanes, or "
                             "data.tokenize=all (lanes then go round the source in epochs)")

    def batch(self, step: int):
        if step < 0:
            raise ValueError(f"step={step} is negative; steps count from 0")
        self._ensure(step)
        T = self.seq_len
        if self.layout == "documents":
            rows = np.empty((len(self.lanes), T + 1), dtype=np.int64)
            mask = np.empty((len(self.lanes), T), dtype=bool)
            segment = np.empty(len(self.lanes), dtype=np.int64)
            for b, (walk, cum) in enumerate(zip(self.walks, self.cum)):
                pos = int(np.searchsorted(cum, step, side="right")) - 1  # empty documents give no segment
                segment[b] = step - cum[pos]
                r, m = walk.read(np.array([pos]), segment[b:b + 1])
                rows[b], mask[b] = r[0], m[0]
            return make_batch(rows, lanes=self.lanes, step=step, new_stream=segment == 0, loss_mask=mask,
                              segment=segment)
        if self.layout == "packed":
            pos = step * T + np.arange(T + 1)
            starts = np.stack([document_starts(s.cum, pos) for s in self.streams])
            begin = np.array([int(document_start_before(s.cum, pos[:1])[0]) for s in self.streams])
            return make_batch(self.segments(step), lanes=self.lanes, step=step, segment=step - begin // T,
                              **packed_fields(starts))
        return make_batch(self.segments(step), lanes=self.lanes, step=step,
                          new_stream=self.layout == "independent" or step == 0)

    def segments(self, step: int) -> np.ndarray:
        """(B, T + 1) int64 tokens of each lane's segment at `step`."""
        if self.layout == "documents":
            return self._document_rows(step)
        self._ensure(step)
        T = self.seq_len
        return np.stack([s.read(np.array([step * T]), T + 1)[0] for s in self.streams])

    def _document_rows(self, step: int) -> np.ndarray:
        batch = self.batch(step)
        return np.concatenate([batch["input_ids"].numpy(), batch["targets"].numpy()[:, -1:]], axis=1)


__all__ = ["MARGIN_FRACTION", "MARGIN_STEPS", "Grow", "SourceOrderSampler", "estimate_tokens", "heldout_count",
           "missing_tokens", "split", "steps_to_cover"]
