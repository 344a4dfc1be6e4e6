"""The mix DataModule (task.text_rows): corpus rows and task rows in one batch, with the DataModules' contract
(a pure function of the step, exact resume, ranks own disjoint lanes) and the layout the intervention walks."""

import itertools

import pytest
import torch

from recurlen.evaluation.tasks.config import load_task_experiment
from recurlen.evaluation.tasks.datamodules import build_task_datamodule
from recurlen.evaluation.tasks.mix import MixDataModule


def _cfg(cache_dir, *overrides):
    return load_task_experiment(["experiment=passkey", "data.batch_size=4", "task.text_rows=2", "data.max_documents=60",
                                 "data.val_fraction=0.2", "data.val_segments=4", "data.val_sequences=2",
                                 "data.val_length=512", "task.val_batches=1", f"data.cache_dir={cache_dir}",
                                 *overrides])


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_mix_resume_gives_the_batches_an_uninterrupted_loader_gives(cache_dir):
    dm = build_task_datamodule(_cfg(cache_dir))
    assert isinstance(dm, MixDataModule)
    full = list(itertools.islice(iter(dm.train_dataloader()), 6))
    dm = build_task_datamodule(_cfg(cache_dir))
    for batch in itertools.islice(iter(dm.train_dataloader()), 4):
        dm.record_step(int(batch["step"]))  # what on_before_batch_transfer does under the Trainer
    state = dm.state_dict()
    assert state["next_step"] == 4 and state["text"]["next_step"] == 0  # the mix's step is the one that counts
    again = build_task_datamodule(_cfg(cache_dir))
    again.load_state_dict(state)
    rest = list(itertools.islice(iter(again.train_dataloader()), 2))
    assert all(_same(got, want) for got, want in zip(rest, full[4:]))
    assert [int(b["step"]) for b in rest] == [4, 5]
    # deterministic: a new DataModule gives the same batch for a step, another step another batch
    assert _same(build_task_datamodule(_cfg(cache_dir)).train_batch(3), full[3])
    assert not torch.equal(full[3]["input_ids"], full[2]["input_ids"])


def test_text_rows_first_then_passkey_rows_each_scored_as_alone(cache_dir):
    cfg = _cfg(cache_dir)
    batch = build_task_datamodule(cfg).train_batch(0)
    assert batch["input_ids"].shape == (4, 256) and batch["lane"].tolist() == [0, 1, 2, 3]
    # text rows (independent layout for fitted noise): every target scored; passkey rows: the answer and EOS
    assert batch["loss_mask"][:2].all()
    assert batch["loss_mask"][2:].sum(dim=1).tolist() == [7, 7]
    assert batch["new_stream"][2:].all()
    tok = build_task_datamodule(cfg).tokenizer
    assert all("The pass key is" in tok.decode(batch["input_ids"][r].tolist()) for r in (2, 3))
    assert not any("The pass key is" in tok.decode(batch["input_ids"][r].tolist()) for r in (0, 1))
    # the task rows are those of the task DataModule alone (lanes after the text lanes)
    alone = build_task_datamodule(_cfg(cache_dir, "task.text_rows=0", "data.batch_size=2")).train_batch(0)
    assert torch.equal(batch["input_ids"][2:], alone["input_ids"])


def test_tbptt_walks_the_text_rows_documents_and_restarts_every_task_row(cache_dir):
    dm = build_task_datamodule(_cfg(cache_dir, "intervention=tbptt"))
    assert dm.text.cfg.layout == "documents"
    first, second = dm.train_batch(0), dm.train_batch(1)
    assert "segment" in first and first["segment"][2:].tolist() == [0, 0]
    assert second["new_stream"][2:].all()
    # a text lane that did not start a document continues the previous step's row: its first input is the
    # previous row's last target
    cont = [r for r in range(2) if not second["new_stream"][r]]
    assert cont, "no text lane continued its document at step 1"
    for r in cont:
        assert second["input_ids"][r, 0] == first["targets"][r, -1]


def test_ranks_own_disjoint_lanes(cache_dir):
    from recurlen.training.data.datamodule import RecurlenDataModule

    cfg = _cfg(cache_dir)
    mixes = []
    for rank in range(2):
        dm = build_task_datamodule(cfg)
        text = RecurlenDataModule(dm.text.cfg, rank=rank, world_size=2)
        dm.task.rank, dm.task.world_size = rank, 2
        mixes.append(MixDataModule(text=text, task=dm.task))
    lanes = [m.train_batch(0)["lane"].tolist() for m in mixes]
    # text lanes 0..3 over both ranks, task lanes after them
    assert lanes == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert [m.lanes.tolist() for m in mixes] == lanes


def test_validation_and_long_sequences_come_from_both_halves(cache_dir):
    dm = build_task_datamodule(_cfg(cache_dir))
    dm.setup("fit")
    val = list(dm.val_dataloader())
    assert len(val) == 2 + 1  # 4 text segments in batches of 2 rows, then the task's batch
    assert "loss_mask" not in val[0] and val[-1]["loss_mask"].sum(dim=1).tolist() == [7, 7]
    assert dm.long_validation_sequences().shape == (2, 512)


def test_bad_mixes_are_refused_in_one_line(cache_dir):
    with pytest.raises(ValueError, match=r"task.text_rows=4 leaves no task rows in a batch of data.batch_size=4"):
        _cfg(cache_dir, "task.text_rows=4")
    with pytest.raises(ValueError, match="or mix corpus rows into the task's batches"):
        build_task_datamodule(_cfg(cache_dir, "task.text_rows=0", "intervention=tbptt"))


def test_task_share_weighs_the_loss_between_text_and_task_rows(cache_dir):
    from recurlen.training.lit_module import token_loss

    plain = build_task_datamodule(_cfg(cache_dir)).train_batch(0)
    shared = build_task_datamodule(_cfg(cache_dir, "task.task_share=0.5")).train_batch(0)
    assert all(torch.equal(plain[k], shared[k]) for k in plain if k != "loss_mask")
    w = shared["loss_mask"]
    assert w.dtype == torch.float32 and torch.equal(w > 0, plain["loss_mask"])
    assert float(w.sum()) == pytest.approx(float(plain["loss_mask"].sum()))  # the loss keeps its scale
    # the LightningModule's loss with these weights: half the text rows' mean, half the task rows' mean
    torch.manual_seed(0)
    logits = torch.randn(*w.shape, 257)
    targets = shared["targets"]
    text = token_loss(logits[:2], targets[:2], plain["loss_mask"][:2])
    task = token_loss(logits[2:], targets[2:], plain["loss_mask"][2:])
    assert float(token_loss(logits, targets, w)) == pytest.approx(0.5 * float(text) + 0.5 * float(task), rel=1e-5)
    # unweighted, the 14 answer tokens are 14 / 526 of the loss
    n_text, n_task = float(plain["loss_mask"][:2].sum()), float(plain["loss_mask"][2:].sum())
    assert float(token_loss(logits, targets, plain["loss_mask"])) == pytest.approx(
        (n_text * float(text) + n_task * float(task)) / (n_text + n_task), rel=1e-5)
    with pytest.raises(ValueError, match=r"task.task_share=1.0 must be in \(0, 1\)"):
        _cfg(cache_dir, "task.task_share=1.0")


def test_the_dry_run_says_what_the_mix_is(capsys):
    from recurlen.commands import cli

    assert cli.main(["passkey", "task.text_rows=8", "task.task_share=0.5", "--dry-run"]) == 0
    assert ("mix          8 of the 16 rows corpus text in the intervention's layout, the rest passkey examples; "
            "loss: task share 0.5") in capsys.readouterr().out
    assert cli.main(["passkey", "--dry-run"]) == 0
    assert "mix " not in capsys.readouterr().out


def test_packed_text_rows_keep_their_resets_and_task_rows_start_a_stream(cache_dir):
    batch = build_task_datamodule(_cfg(cache_dir, "data.layout=packed")).train_batch(3)
    resets = batch["resets"]
    assert resets.shape == (4, 256) and resets.dtype == torch.bool
    assert resets[2:, 0].all() and not resets[2:, 1:].any()  # each task row: one example from its first token
    assert torch.equal(resets[:2, 0], batch["new_stream"][:2])  # the text rows' own flags, column 0 as new_stream
    assert batch["segment"][2:].tolist() == [0, 0]
