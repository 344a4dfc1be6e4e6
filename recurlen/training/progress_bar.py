"""The training progress bar: optimizer steps out of trainer.max_steps, with the loss and tokens/s."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import TQDMProgressBar


class StepProgressBar(TQDMProgressBar):
    """The training bar counts optimizer steps, `train: 120/500 [.., loss=.., tok/s=..]`, not epochs of an
    endless stream (Lightning's default shows 'Epoch 0' with no total)."""

    def on_train_epoch_start(self, trainer: pl.Trainer, *_: Any) -> None:
        bar = self.train_progress_bar
        bar.reset(total=trainer.max_steps)
        bar.initial = 0
        bar.n = trainer.global_step  # a resumed run starts where it left off
        bar.unit = "step"
        bar.set_description("train")
        bar.refresh()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        bar = self.train_progress_bar
        n = trainer.global_step
        if bar is not None and n != bar.n and self._should_update(n, bar.total):
            bar.n = n
            bar.set_postfix(self.get_metrics(trainer, pl_module))  # refreshes

    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        rate = metrics.pop("train/tokens_per_s", None)
        if rate is not None:
            metrics["tok/s"] = f"{float(rate):.0f}"
        return {k.removeprefix("train/"): v for k, v in metrics.items()}


__all__ = ["StepProgressBar"]
