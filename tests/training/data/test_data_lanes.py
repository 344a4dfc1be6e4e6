"""Lanes: positions are pure functions of (seed, step, rank, world size), checked against a naive rebuild."""

from __future__ import annotations

import numpy as np
import pytest

from recurlen.training.data import lanes as L
from recurlen.training.data.corpus import Corpus
from recurlen.training.data.stream import DocStream, TrainSampler

EOS = 999


def make_corpus(num_docs: int = 37, seed: int = 0) -> Corpus:
    # Lengths from 1 to 60: shorter and longer than the segments used below (T = 8 or 16).
    rng = np.random.default_rng(seed)
    docs = [rng.integers(0, 500, size=int(n)) for n in rng.integers(1, 60, size=num_docs)]
    return Corpus.from_documents(docs)


def naive_stream(corpus: Corpus, doc_ids: np.ndarray) -> np.ndarray:
    parts = []
    for d in doc_ids:
        parts += [corpus.document(int(d)), [EOS]]
    return np.concatenate(parts).astype(np.int64)


def naive_lane_stream(corpus: Corpus, train_ids: np.ndarray, lane: int, num_lanes: int, seed: int,
                      epochs: int) -> np.ndarray:
    """Lane g's stream by the definition in lanes.py: its span of each epoch stream, then EOS."""
    out = []
    for epoch in range(epochs):
        stream = naive_stream(corpus, train_ids[L.doc_order(seed, epoch, len(train_ids))])
        span = len(stream) // num_lanes
        out += [stream[lane * span:(lane + 1) * span], [EOS]]
    return np.concatenate(out)


def sampler(corpus: Corpus, *, layout: str, rank: int = 0, world: int = 1, batch: int = 4, seq_len: int = 8,
            seed: int = 3) -> TrainSampler:
    train_ids = np.arange(corpus.num_documents)
    return TrainSampler(corpus, train_ids, lanes=L.global_lanes(rank, world, batch), num_global_lanes=batch * world,
                        seq_len=seq_len, layout=layout, seed=seed, eos_id=EOS)


def test_doc_stream_reads_match_naive_concatenation() -> None:
    corpus = make_corpus()
    order = np.random.default_rng(1).permutation(corpus.num_documents)
    stream, naive = DocStream(corpus, order, EOS), naive_stream(corpus, order)
    assert stream.length == len(naive) == corpus.num_tokens + corpus.num_documents
    rng = np.random.default_rng(2)
    for length in (1, 7, 59, 60, 200):  # within one document, across one EOS, across many documents
        starts = rng.integers(0, len(naive) - length + 1, size=50)
        np.testing.assert_array_equal(stream.read(starts, length), np.stack([naive[s:s + length] for s in starts]))


def test_empty_documents_read_as_lone_eos() -> None:
    corpus = Corpus.from_documents([[1, 2], [], [3]])
    stream = DocStream(corpus, np.arange(3), EOS)
    np.testing.assert_array_equal(stream.read(np.array([0]), 6)[0], [1, 2, EOS, EOS, 3, EOS])


@pytest.mark.parametrize("seq_len", [8, 16])
def test_contiguous_lanes_continue_across_many_steps_and_epochs(seq_len: int) -> None:
    corpus = make_corpus()
    s = sampler(corpus, layout="contiguous", seq_len=seq_len)
    steps = 3 * (s.span + 1) // seq_len + 2  # about three epochs of every lane
    segs = np.stack([s.segments(k) for k in range(steps)])  # (steps, B, T + 1)
    # Segment k + 1 starts at the token right after segment k's inputs end.
    np.testing.assert_array_equal(segs[1:, :, 0], segs[:-1, :, seq_len])
    for lane in range(4):
        got = np.concatenate([segs[k, lane, :seq_len] for k in range(steps)])
        expected = naive_lane_stream(corpus, np.arange(corpus.num_documents), lane, 4, seed=3, epochs=4)
        np.testing.assert_array_equal(got, expected[:len(got)])
    # Lanes are different parts of the epoch: no two lanes read the same segment.
    assert len({segs[5, lane].tobytes() for lane in range(4)}) == 4


def test_contiguous_flags_and_batch_contract() -> None:
    s = sampler(make_corpus(), layout="contiguous")
    b0, b1 = s.batch(0), s.batch(1)
    assert b0["new_stream"].tolist() == [True] * 4 and b1["new_stream"].tolist() == [False] * 4
    assert b0["input_ids"].shape == b0["targets"].shape == (4, 8)
    assert b0["lane"].tolist() == [0, 1, 2, 3] and int(b1["step"]) == 1 and b1["step"].shape == ()
    assert (b0["input_ids"][:, 1:] == b0["targets"][:, :-1]).all()
    assert (b0["targets"][:, -1] == b1["input_ids"][:, 0]).all()


def test_independent_visits_every_slot_once_per_epoch_and_reads_it() -> None:
    corpus = make_corpus()
    s = sampler(corpus, layout="independent", seq_len=8)
    per_epoch = s.num_slots // 4  # whole steps inside epoch 0
    starts = np.concatenate([L.independent_segments(k, s.lanes, seed=3, num_global_lanes=4, num_slots=s.num_slots,
                                                    seq_len=8)[1] for k in range(per_epoch)])
    assert len(set(starts.tolist())) == len(starts) == per_epoch * 4
    assert set(starts.tolist()) <= {i * 8 for i in range(s.num_slots)}
    naive = naive_stream(corpus, np.arange(corpus.num_documents)[L.doc_order(3, 0, corpus.num_documents)])
    seg = s.segments(2)
    _, st = L.independent_segments(2, s.lanes, seed=3, num_global_lanes=4, num_slots=s.num_slots, seq_len=8)
    np.testing.assert_array_equal(seg, np.stack([naive[a:a + 9] for a in st]))
    b1, b2 = s.batch(1), s.batch(2)
    assert not (b1["input_ids"] == b2["input_ids"]).all(dim=1).any()  # fresh segments each step
    assert b1["new_stream"].all() and b2["new_stream"].all()


def test_epoch_orders_depend_on_seed_and_epoch() -> None:
    a, b, c = L.doc_order(0, 0, 50), L.doc_order(0, 1, 50), L.doc_order(1, 0, 50)
    assert sorted(a.tolist()) == list(range(50))
    assert a.tolist() != b.tolist() and a.tolist() != c.tolist()
    np.testing.assert_array_equal(a, L.doc_order(0, 0, 50))


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_rank_shards_are_disjoint_and_cover_all_lanes(world: int) -> None:
    shards = [L.global_lanes(r, world, 5).tolist() for r in range(world)]
    flat = [g for shard in shards for g in shard]
    assert sorted(flat) == list(range(5 * world)) and len(set(flat)) == len(flat)


def naive_document_segments(corpus: Corpus, train_ids: np.ndarray, seed: int, epoch: int, seq_len: int) -> list:
    """The documents layout by its definition: every document + EOS cut into rows of T + 1 tokens stepping T,
    the tail padded with EOS; (tokens, scored targets, segment index within the document) in epoch order."""
    out = []
    for d in train_ids[L.doc_order(seed, epoch, len(train_ids))]:
        doc = np.concatenate([corpus.document(int(d)), [EOS]]).astype(np.int64)
        for k in range(-(-(len(doc) - 1) // seq_len)):
            piece = doc[k * seq_len:k * seq_len + seq_len + 1]
            row = np.full(seq_len + 1, EOS, dtype=np.int64)
            row[:len(piece)] = piece
            out.append((row, np.arange(seq_len) < len(piece) - 1, k))
    return out


@pytest.mark.parametrize("seq_len", [8, 16])
def test_document_lanes_walk_whole_documents_and_flag_every_new_one(seq_len: int) -> None:
    base = make_corpus()
    corpus = Corpus.from_documents([base.document(i) for i in range(base.num_documents)] + [[]])  # one empty
    train_ids, batch = np.arange(corpus.num_documents), 4
    s = sampler(corpus, layout="documents", seq_len=seq_len, batch=batch)
    K = s.lane_segments
    epochs = [naive_document_segments(corpus, train_ids, 3, e, seq_len) for e in range(3)]
    assert len(epochs[0]) // batch == K and all(len(e) == len(epochs[0]) for e in epochs)
    for step in range(3 * K):
        b = s.batch(step)
        epoch, within = divmod(step, K)
        for lane in range(batch):
            row, mask, k = epochs[epoch][lane * K + within]
            np.testing.assert_array_equal(b["input_ids"][lane].numpy(), row[:-1])
            np.testing.assert_array_equal(b["targets"][lane].numpy(), row[1:])
            np.testing.assert_array_equal(b["loss_mask"][lane].numpy(), mask)
            assert int(b["segment"][lane]) == k
            # A new stream exactly where a document starts or the lane's slice of the epoch starts.
            assert bool(b["new_stream"][lane]) == (k == 0 or within == 0), (step, lane)
            if not b["new_stream"][lane]:  # within a document: it continues where the last segment ended
                assert int(b["input_ids"][lane, 0]) == int(s.batch(step - 1)["targets"][lane, -1])
    # Tails are padded and not scored; every document ends with a scored EOS target.
    masks = np.stack([m for _, m, _ in epochs[0]])
    assert (~masks).any() and (masks.sum(1) >= 1).all()
    assert sum(int(m.sum()) for _, m, _ in epochs[0]) == corpus.num_tokens  # each token predicted once (EOS too)


@pytest.mark.parametrize("layout", ["contiguous", "independent", "documents"])
def test_ranks_read_their_rows_of_the_global_batch(layout: str) -> None:
    # Positions depend only on the global lane: 2 ranks x 2 lanes read what 1 rank x 4 lanes reads.
    corpus = make_corpus()
    whole = sampler(corpus, layout=layout, batch=4)
    parts = [sampler(corpus, layout=layout, rank=r, world=2, batch=2) for r in range(2)]
    for step in (0, 1, 7, 40):
        np.testing.assert_array_equal(np.concatenate([p.segments(step) for p in parts]), whole.segments(step))
        assert parts[1].batch(step)["lane"].tolist() == [2, 3]
    first = [p.segments(3) for p in parts]
    assert not any(np.array_equal(x, y) for x in first[0] for y in first[1])


def test_bad_rank_and_tiny_corpus_raise() -> None:
    with pytest.raises(ValueError, match=r"rank=2 is out of range for world_size=2"):
        L.global_lanes(2, 2, 4)
    tiny = Corpus.from_documents([[1, 2, 3]] * 4)  # 16 stream tokens
    with pytest.raises(ValueError, match=r"has 16 tokens .* needs at least 36"):
        sampler(tiny, layout="contiguous", batch=4, seq_len=8)
    with pytest.raises(ValueError, match=r"fewer than seq_len \+ 1 = 33"):
        sampler(tiny, layout="independent", batch=4, seq_len=32)
    with pytest.raises(ValueError, match=r"step=-1 is negative"):
        sampler(make_corpus(), layout="contiguous").segments(-1)
    with pytest.raises(ValueError, match=r"has 4 segments of seq_len = 8 .* needs at least one per lane"):
        sampler(Corpus.from_documents([[1, 2, 3]] * 4), layout="documents", batch=8, seq_len=8)
    with pytest.raises(ValueError, match=r"step=-1 is negative"):
        sampler(make_corpus(), layout="documents").batch(-1)
