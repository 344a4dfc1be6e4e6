"""Exact resume: take N batches, save, rebuild, load, the next M batches equal the uninterrupted run's."""

from __future__ import annotations

from itertools import islice
from pathlib import Path

import pytest
import torch

from recurlen.training.data import DataConfig, RecurlenDataModule

KEYS = ("input_ids", "targets", "lane", "new_stream", "step", "loss_mask", "segment")


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("resume-cache")


def make_dm(cache: Path, *, layout: str = "contiguous", rank: int = 0, world: int = 1, workers: int = 0,
            seed: int = 5) -> RecurlenDataModule:
    cfg = DataConfig(cache_dir=str(cache), max_documents=60, seq_len=16, batch_size=3, layout=layout, seed=seed,
                     num_workers=workers, val_segments=0, val_sequences=0)
    return RecurlenDataModule(cfg, rank=rank, world_size=world)


def consume(dm: RecurlenDataModule, n: int) -> list[dict[str, torch.Tensor]]:
    """What a training loop does: take batches and report each one as consumed."""
    out = []
    for batch in islice(iter(dm.train_dataloader()), n):
        dm.record_step(int(batch["step"]))
        out.append(batch)
    return out


def assert_same(a: list[dict[str, torch.Tensor]], b: list[dict[str, torch.Tensor]]) -> None:
    assert len(a) == len(b) > 0
    for x, y in zip(a, b):
        assert set(x) == set(y)
        for key in KEYS:
            if key in x:
                assert torch.equal(x[key], y[key]), key


@pytest.mark.parametrize("layout", ["contiguous", "independent", "documents"])
@pytest.mark.parametrize("world", [1, 2])
def test_resume_yields_the_uninterrupted_batches(cache: Path, layout: str, world: int) -> None:
    n, m = 7, 6
    for rank in range(world):
        uninterrupted = consume(make_dm(cache, layout=layout, rank=rank, world=world), n + m)
        assert [int(b["step"]) for b in uninterrupted] == list(range(n + m))
        first = make_dm(cache, layout=layout, rank=rank, world=world)
        consume(first, n)
        state = first.state_dict()
        assert state["next_step"] == n and state["world_size"] == world
        resumed = make_dm(cache, layout=layout, rank=rank, world=world)
        resumed.load_state_dict(state)
        after = consume(resumed, m)
        assert_same(after, uninterrupted[n:])
        assert resumed.state_dict()["next_step"] == n + m
        if layout == "contiguous":
            assert not after[0]["new_stream"].any()  # the lanes continue: the module keeps their states


def test_workers_keep_step_order_and_state_counts_consumed_batches(cache: Path) -> None:
    direct = make_dm(cache)
    expected = [direct.train_batch(k) for k in range(12)]
    with_workers = make_dm(cache, workers=2)
    loader = iter(with_workers.train_dataloader())
    got = []
    for batch in islice(loader, 5):
        with_workers.record_step(int(batch["step"]))
        got.append(batch)
    # The workers have already produced batches beyond step 4; the state still names step 5.
    assert with_workers.state_dict()["next_step"] == 5
    del loader
    resumed = make_dm(cache, workers=2)
    resumed.load_state_dict(with_workers.state_dict())
    got += consume(resumed, 7)
    assert_same(got, expected)


def test_start_step_and_bounded_loader(cache: Path) -> None:
    dm = make_dm(cache, layout="independent")
    assert_same(list(dm.train_dataloader(start_step=40, num_steps=3)), [dm.train_batch(k) for k in (40, 41, 42)])
    dm.set_step(9)
    assert int(next(iter(dm.train_dataloader()))["step"]) == 9 and dm.state_dict()["next_step"] == 9
    with pytest.raises(ValueError, match="step=-2 is negative"):
        dm.set_step(-2)


def test_seed_changes_the_stream_but_not_the_held_out_split(cache: Path) -> None:
    a, b = make_dm(cache, seed=1), make_dm(cache, seed=2)
    assert not torch.equal(a.train_batch(3)["input_ids"], b.train_batch(3)["input_ids"])
    assert torch.equal(a.train_batch(3)["input_ids"], make_dm(cache, seed=1).train_batch(3)["input_ids"])
    assert a.corpus.split(0.05)[1].tolist() == b.corpus.split(0.05)[1].tolist()


def test_changed_world_size_on_resume_is_reported(cache: Path, caplog: pytest.LogCaptureFixture) -> None:
    saved = make_dm(cache, world=2)
    consume(saved, 2)
    resumed = make_dm(cache, world=1)
    resumed.setup()
    resumed.load_state_dict(saved.state_dict())
    assert resumed.next_step == 2
    assert "changed settings {'world_size': (2, 1)}" in caplog.text


def test_rank_and_world_size_arguments_are_checked(cache: Path) -> None:
    with pytest.raises(ValueError, match=r"rank=3 is out of range for world_size=2"):
        make_dm(cache, rank=3, world=2)
