"""The training progress bar: optimizer steps out of trainer.max_steps, with the loss and tokens/s; validation
announced in a log line and shown in labelled bars."""

from __future__ import annotations

import logging
import sys
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

log = logging.getLogger(__name__)


class StepProgressBar(TQDMProgressBar):
    """The training bar counts optimizer steps, `train: 120/500 [.., loss=.., tok/s=..]`, not epochs of an
    endless stream (Lightning's default shows 'Epoch 0' with no total).

    Validation (in-context loss, then the diagnostics of the run, e.g. position-wise loss on the long held-out
    sequences) can take longer than the training steps of a short run: it is announced, and each part has a bar
    that says it is validation and what it measures."""

    def init_train_tqdm(self) -> Tqdm:
        # Made in its final form: Lightning's bar, made here and reset at the epoch start, first drew a stray
        # `Training: 0/?` and `0/20` line. `initial` is where a resumed run starts, so the rate counts only the
        # steps of this process.
        trainer = self.trainer
        return Tqdm(desc="train", unit="step", total=trainer.max_steps, initial=trainer.global_step,
                    position=2 * self.process_position, disable=self.is_disabled, leave=True, dynamic_ncols=True,
                    file=sys.stdout, smoothing=0, bar_format=self.BAR_FORMAT)

    def on_train_epoch_start(self, trainer: pl.Trainer, *_: Any) -> None:
        pass  # one bar for the whole run (the stream of steps has no epochs), made in on_train_start

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        bar = self.train_progress_bar
        n = trainer.global_step
        if bar is not None and n != bar.n and self._should_update(n, bar.total):
            bar.n = n
            bar.set_postfix(self.get_metrics(trainer, pl_module))  # refreshes

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.train_progress_bar.disable:
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))

    def init_validation_tqdm(self) -> Tqdm:
        # Labelled and sized when made: Lightning's bar first drew `Validation: 0/?`, then `Validation DataLoader 0`.
        has_main_bar = self.trainer.state.fn != "validate"
        total = self.total_val_batches
        return Tqdm(desc=_val_description(self.trainer, total), unit="batch", total=_finite(total),
                    position=2 * self.process_position + has_main_bar, disable=self.is_disabled,
                    leave=not has_main_bar, dynamic_ncols=True, file=sys.stdout, bar_format=self.BAR_FORMAT)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking and trainer.is_global_zero:
            log.info("%s", validation_announcement(trainer))  # above the bar, which it explains
        super().on_validation_start(trainer, pl_module)

    def on_validation_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                                  batch_idx: int, dataloader_idx: int = 0) -> None:
        if not self.has_dataloader_changed(dataloader_idx) or self.val_progress_bar.disable:
            return
        total = self.total_val_batches_current_dataloader
        bar = self.val_progress_bar
        if bar.total != _finite(total):  # more than one validation dataloader: one bar, restarted for each
            bar.set_description(_val_description(trainer, total), refresh=False)
            bar.reset(total=_finite(total))

    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        rate = metrics.pop("train/tokens_per_s", None)
        if rate is not None:
            metrics["tok/s"] = f"{float(rate):.0f}"
        return {k.removeprefix("train/"): v for k, v in metrics.items()}


def _finite(total: float) -> float | None:
    return None if total == float("inf") else total


def _val_description(trainer: pl.Trainer, total: float) -> str:
    what = "sanity check" if trainer.sanity_checking else "validation"
    return f"{what} (in-context loss, {total} batches)" if _finite(total) else f"{what} (in-context loss)"


def validation_announcement(trainer: pl.Trainer) -> str:
    """One line before a validation pass: at which step, and what it runs (the diagnostics that are due)."""
    step, total = trainer.global_step, trainer.max_steps
    when = " (end of run)" if step >= total else ""
    parts = ["in-context loss"]
    for cb in trainer.callbacks:
        every = getattr(cb, "every_n_val_epochs", None)
        title = getattr(cb, "title", None)
        if every and title and (getattr(cb, "val_epochs", 0) + 1) % every == 0:
            parts.append(title)
    return f"validation at step {step}/{total}{when}: {', '.join(parts)}"


__all__ = ["StepProgressBar", "validation_announcement"]
