"""The DataModule inside a real Lightning Trainer: checkpoint mid-run, resume through ckpt_path."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from recurlen.training.data import DataConfig, RecurlenDataModule


class Recorder(L.LightningModule):
    """A bigram model that records every training and validation batch it sees."""

    def __init__(self) -> None:
        super().__init__()
        self.logits = torch.nn.Embedding(257, 257)
        self.train_seen: list[dict[str, torch.Tensor]] = []
        self.val_steps = 0

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        self.train_seen.append({k: v.clone() for k, v in batch.items()})
        return F.cross_entropy(self.logits(batch["input_ids"]).flatten(0, 1), batch["targets"].flatten())

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.val_steps += 1

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class StateProbe(Callback):
    """The DataModule's saved position after each validation run (validation batches must not move it)."""

    def __init__(self) -> None:
        self.after_validation: list[int] = []

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.after_validation.append(trainer.datamodule.state_dict()["next_step"])


def fit(dm: RecurlenDataModule, ckpt_dir: Path, *, max_steps: int, ckpt_path: Path | None = None,
        probe: StateProbe | None = None) -> Recorder:
    model = Recorder()
    trainer = L.Trainer(max_steps=max_steps, accelerator="cpu", devices=1, use_distributed_sampler=False,
                        val_check_interval=3, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0,
                        callbacks=[ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=2, save_top_k=-1,
                                                   filename="{step}"), probe or StateProbe()])
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
    return model


@pytest.mark.parametrize("layout", ["contiguous", "independent"])
def test_trainer_checkpoint_resume_restores_the_data_stream(tmp_path: Path, layout: str) -> None:
    def make_dm() -> RecurlenDataModule:
        # Workers prefetch batches ahead of the training step; the checkpoint must not count those.
        cfg = DataConfig(cache_dir=str(tmp_path / "cache"), max_documents=40, seq_len=16, batch_size=4, layout=layout,
                         num_workers=2, val_segments=5, val_fraction=0.2, val_sequences=0)
        return RecurlenDataModule(cfg)

    probe = StateProbe()
    whole = fit(make_dm(), tmp_path / "ckpt", max_steps=7, probe=probe)
    assert [int(b["step"]) for b in whole.train_seen] == list(range(7))
    assert whole.val_steps == 2 * 2  # validation after train batches 3 and 6, 2 batches each
    assert probe.after_validation == [3, 6]  # validation batches (which carry a step too) were not counted
    ckpt = tmp_path / "ckpt" / "step=4.ckpt"
    assert torch.load(ckpt, weights_only=False)["RecurlenDataModule"]["next_step"] == 4

    fresh = make_dm()
    resumed = fit(fresh, tmp_path / "ckpt2", max_steps=7, ckpt_path=ckpt)
    assert [int(b["step"]) for b in resumed.train_seen] == [4, 5, 6]
    for got, want in zip(resumed.train_seen, whole.train_seen[4:]):
        for key in ("input_ids", "targets", "lane", "new_stream", "step"):
            assert torch.equal(got[key], want[key]), key
    assert fresh.state_dict()["next_step"] == 7
    if layout == "contiguous":
        assert not resumed.train_seen[0]["new_stream"].any()
