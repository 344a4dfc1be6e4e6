"""Held-out data: fixed validation segments, long validation sequences, and their errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from recurlen.training.data import DataConfig, RecurlenDataModule


def write_docs(path: Path, lengths: list[int]) -> Path:
    rng = np.random.default_rng(0)
    rows = [{"text": "".join(chr(c) for c in rng.integers(97, 123, size=n)), "id": f"doc-{i}"}
            for i, n in enumerate(lengths)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def make_dm(tmp_path: Path, lengths: list[int], *, rank: int = 0, world: int = 1, **overrides) -> RecurlenDataModule:
    source = write_docs(tmp_path / "docs.jsonl", lengths)
    cfg = dict(source=str(source), cache_dir=str(tmp_path / "cache"), id_field="id", seq_len=8, batch_size=4,
               val_fraction=0.4, val_segments=10, val_sequences=2, val_length=64)
    return RecurlenDataModule(DataConfig(**{**cfg, **overrides}), rank=rank, world_size=world)


def heldout_stream(dm: RecurlenDataModule) -> tuple[list[np.ndarray], np.ndarray]:
    _, held = dm.corpus.split(dm.cfg.val_fraction)
    docs = [dm.corpus.document(int(i)) for i in held]
    return docs, np.concatenate([np.append(d, dm.eos_id) for d in docs])


LENGTHS = [30, 200, 90, 150, 12, 300, 64, 80, 45, 260, 120, 33, 70, 500, 18, 240, 99, 140, 75, 310]


def test_val_segments_are_fixed_held_out_and_spread(tmp_path: Path) -> None:
    dm = make_dm(tmp_path, LENGTHS)
    batches = list(dm.val_dataloader())
    assert [b["input_ids"].shape[0] for b in batches] == [4, 4, 2]
    _, stream = heldout_stream(dm)
    seg = torch.cat([torch.cat([b["input_ids"], b["targets"][:, -1:]], 1) for b in batches]).numpy()
    starts = np.linspace(0, len(stream) - 9, 10).round().astype(int)
    np.testing.assert_array_equal(seg, np.stack([stream[s:s + 9] for s in starts]))
    assert torch.cat([b["lane"] for b in batches]).tolist() == list(range(10))
    assert all(b["new_stream"].all() for b in batches)
    again = list(make_dm(tmp_path, LENGTHS).val_dataloader())
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(batches, again))


def test_val_segments_are_split_across_ranks(tmp_path: Path) -> None:
    per_rank = [list(make_dm(tmp_path, LENGTHS, rank=r, world=3).val_dataloader()) for r in range(3)]
    lanes = [torch.cat([b["lane"] for b in batches]).tolist() for batches in per_rank]
    assert lanes == [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]]  # equal counts, wrapping like DistributedSampler
    assert sorted(set(sum(lanes, []))) == list(range(10))


def test_long_sequences_first_mode_takes_document_starts(tmp_path: Path) -> None:
    dm = make_dm(tmp_path, LENGTHS, val_length=100)
    docs, _ = heldout_stream(dm)
    long = dm.long_validation_sequences()
    expected = [d[:100] for d in docs if len(d) >= 100][:2]
    assert long.shape == (2, 100) and long.dtype == torch.long
    np.testing.assert_array_equal(long.numpy(), np.stack(expected))
    assert torch.equal(long, make_dm(tmp_path, LENGTHS, val_length=100).long_validation_sequences())


def test_long_sequences_pack_mode_joins_documents_with_eos(tmp_path: Path) -> None:
    dm = make_dm(tmp_path, LENGTHS, val_mode="pack", val_length=200, val_sequences=3)
    _, stream = heldout_stream(dm)
    long = dm.long_validation_sequences()
    np.testing.assert_array_equal(long.numpy(), stream[:600].reshape(3, 200))
    assert (long == dm.eos_id).any()


def test_long_sequences_windows_mode_round_robin_inside_documents(tmp_path: Path) -> None:
    dm = make_dm(tmp_path, LENGTHS, val_mode="windows", val_length=60, val_sequences=7)
    docs, _ = heldout_stream(dm)
    long = dm.long_validation_sequences().numpy()
    per_doc = [len(d) // 60 for d in docs]
    expected = [d[k * 60:(k + 1) * 60] for k in range(max(per_doc)) for d, n in zip(docs, per_doc) if n > k][:7]
    np.testing.assert_array_equal(long, np.stack(expected))
    assert not (long == dm.eos_id).any()  # each window is running text of one document
    with pytest.raises(ValueError, match="val_mode='windows' needs 500 windows of 60 tokens"):
        dm.long_validation_sequences(num=500)


def test_documents_too_short_for_val_length(tmp_path: Path) -> None:
    dm = make_dm(tmp_path, LENGTHS, val_length=4000, val_sequences=0)
    dm.setup()
    docs, _ = heldout_stream(dm)
    longest = max(len(d) for d in docs)
    with pytest.raises(ValueError, match=rf"needs 2 held-out documents of at least val_length=4000 tokens but found "
                                         rf"0 among {len(docs)} held-out documents \(the longest has {longest} "
                                         r"tokens\).*val_mode='pack'"):
        dm.long_validation_sequences(num=2)
    eager = make_dm(tmp_path, LENGTHS, val_length=4000)
    with pytest.raises(ValueError, match=r"found 0 among"):
        eager.setup()  # fails at setup, before any training
    with pytest.raises(ValueError, match=r"val_mode='pack' needs 2 x 4000 = 8000 held-out tokens"):
        make_dm(tmp_path, LENGTHS, val_length=4000, val_mode="pack").setup()


def test_no_held_out_documents(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"val_fraction=0.0 held out none of the 20 documents"):
        make_dm(tmp_path, LENGTHS, val_fraction=0.0).setup()
    dm = make_dm(tmp_path, LENGTHS, val_fraction=0.0, val_segments=0, val_sequences=0)
    dm.setup()  # training without validation data is allowed
    assert list(dm.val_dataloader()) == [] and dm.train_batch(0)["input_ids"].shape == (4, 8)
