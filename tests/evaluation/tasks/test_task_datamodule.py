"""Task DataModules: the corpus DataModule's contract (resume by step, ranks own lanes, loss mask)."""

import itertools

import pytest
import torch

from recurlen.evaluation.tasks.config import load_task_experiment
from recurlen.evaluation.tasks.datamodules import TaskDataModule, build_task_datamodule, example_fn


def _cfg(*overrides):
    cfg = load_task_experiment(["experiment=copying", "data.batch_size=3", *overrides])
    return cfg


def test_resume_gives_the_batches_an_uninterrupted_loader_gives():
    dm = build_task_datamodule(_cfg())
    full = list(itertools.islice(iter(dm.train_dataloader()), 6))
    dm = build_task_datamodule(_cfg())
    for batch in itertools.islice(iter(dm.train_dataloader()), 4):
        dm.record_step(int(batch["step"]))  # what on_before_batch_transfer does under the Trainer
    state = dm.state_dict()
    assert state["next_step"] == 4
    again = build_task_datamodule(_cfg())
    again.load_state_dict(state)
    rest = list(itertools.islice(iter(again.train_dataloader()), 2))
    for got, want in zip(rest, full[4:]):
        assert all(torch.equal(got[k], want[k]) for k in want)
    assert [int(b["step"]) for b in rest] == [4, 5]


def test_ranks_own_disjoint_lanes_and_see_different_examples():
    cfg = _cfg()
    tok_cfg = build_task_datamodule(cfg)
    ranks = [TaskDataModule(example_fn(cfg, tok_cfg.tokenizer), tokenizer=tok_cfg.tokenizer, tokenizer_spec="bytes",
                            seq_len=cfg.data.seq_len, batch_size=3, seed=cfg.seed, rank=r, world_size=2)
             for r in range(2)]
    b0, b1 = (dm.train_batch(0) for dm in ranks)
    assert b0["lane"].tolist() == [0, 1, 2] and b1["lane"].tolist() == [3, 4, 5]
    assert not torch.equal(b0["input_ids"], b1["input_ids"])
    # the example of a global lane does not depend on which rank serves it or on the world size
    single = TaskDataModule(example_fn(cfg, tok_cfg.tokenizer), tokenizer=tok_cfg.tokenizer, tokenizer_spec="bytes",
                            seq_len=cfg.data.seq_len, batch_size=6, seed=cfg.seed)
    assert torch.equal(single.train_batch(0)["input_ids"], torch.cat([b0["input_ids"], b1["input_ids"]]))


def test_seed_changes_the_examples_and_loss_on_all_scores_every_real_token():
    a = build_task_datamodule(_cfg()).train_batch(0)
    b = build_task_datamodule(_cfg("seed=1")).train_batch(0)
    assert not torch.equal(a["input_ids"], b["input_ids"])
    cfg = load_task_experiment(["experiment=passkey", "data.batch_size=2", "task.passkey.loss_on=all"])
    batch = build_task_datamodule(cfg).train_batch(0)
    assert batch["loss_mask"].all()  # passkey examples fill the row: no padding to leave out
    cfg = load_task_experiment(["experiment=passkey", "data.batch_size=2"])
    assert build_task_datamodule(cfg).train_batch(0)["loss_mask"].sum(dim=1).tolist() == [7, 7]


def test_bad_settings_fail_when_the_datamodule_is_built():
    with pytest.raises(ValueError, match="data.seq_len=10 is too short for copying strings of length 8"):
        build_task_datamodule(_cfg("data.seq_len=10"))
    with pytest.raises(ValueError, match=r"L=\d+ is too short to hold the key and the question"):
        cfg = load_task_experiment(["experiment=passkey", "data.seq_len=64"])
        build_task_datamodule(cfg)
    with pytest.raises(ValueError, match="intervention tbptt needs documents that continue from step to step"):
        build_task_datamodule(_cfg("intervention=tbptt"))
    cfg = _cfg()
    cfg.task.name = None
    with pytest.raises(ValueError, match=r"task.name=None has no training data; allowed: \['passkey'"):
        build_task_datamodule(cfg)
