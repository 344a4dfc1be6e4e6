"""Task examples mixed with corpus text in every batch: a model that retrieves and is a language model.

    dm = MixDataModule(text=RecurlenDataModule(text_cfg), task=TaskDataModule(...), task_share=0.5)

Each training batch is the corpus DataModule's batch (text_rows rows, the lanes walk the corpus as the
intervention's layout says: documents for TBTT, so its state carries through a document) on top of the task
DataModule's batch (task rows, one independent example each, new_stream always True). Both halves are pure
functions of the step, so the mix is too: resume needs only the next step, as for either half alone.

Global lanes: the text rows keep the corpus DataModule's lanes [0, W * text_rows); the task rows follow them,
W * text_rows + the task DataModule's lane. A carried state (state passing, TBTT) therefore stays with its
row: a text lane carries its document, a task lane starts from zeros under TBTT (a new stream) and, under
state passing, from its previous, unrelated example's final state (as the task DataModule alone does).

The batch has every key either half has: loss_mask (the text rows' own, or all of their targets), segment
(task rows: 0) and resets (task rows: a new stream in column 0 only) where the text layout has them.

The loss share (task.task_share): a task row scores a few answer tokens (a pass key: 7) where a text row scores
all of its T, so with every scored token weighed alike the task would be ~1/40 of the loss of an even mix, and a
tiny model learns the text but never the task (measured: 8 text + 8 passkey rows, 600 steps at T = 256, passkey
accuracy 0 at T). task_share = s makes loss_mask float weights with which the loss is (1 - s) x the text rows'
mean + s x the task rows' mean (the LightningModule's loss is sum(w nll) / sum(w), for a boolean mask as well).

Validation: the corpus DataModule's held-out segments, then the task's fixed batches; the long held-out text
sequences (the position-wise diagnostics read them) are the corpus DataModule's.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

from recurlen.training.data.datamodule import FixedBatches, RecurlenDataModule, TrainBatches
from recurlen.util.tokenizers import UsesTokenizer

STATE_VERSION = 1


def share_weights(mask_BT: torch.Tensor, *, n_text: int, task_share: float) -> torch.Tensor:
    """Float loss weights from the scored targets (B, T) of a batch whose first n_text rows are text: the loss
    sum(w nll) / sum(w) becomes (1 - task_share) x the text rows' mean + task_share x the task rows' mean.
    The weights sum to the number of scored targets, so the loss keeps its scale."""
    m = mask_BT.to(torch.float32)
    total = m.sum()
    text, task = m[:n_text].sum(), m[n_text:].sum()
    if text == 0 or task == 0:  # a half with nothing scored: the other half is the whole loss
        return m
    m[:n_text] *= total * (1.0 - task_share) / text
    m[n_text:] *= total * task_share / task
    return m


def join_batches(text: dict[str, torch.Tensor], task: dict[str, torch.Tensor], *, task_lane_offset: int,
                 task_share: float | None = None) -> dict[str, torch.Tensor]:
    """One batch: the text rows, then the task rows (lanes offset past the text lanes). task_share: the task rows'
    share of the loss (loss_mask becomes float weights, share_weights); None weighs every scored target alike."""
    if text["input_ids"].shape[1] != task["input_ids"].shape[1]:
        raise ValueError(f"text rows of {text['input_ids'].shape[1]} tokens and task rows of "
                         f"{task['input_ids'].shape[1]} cannot share a batch; both are data.seq_len long")
    n_text, n_task = text["input_ids"].shape[0], task["input_ids"].shape[0]
    text_mask = text.get("loss_mask")
    out = {
        "input_ids": torch.cat([text["input_ids"], task["input_ids"]]),
        "targets": torch.cat([text["targets"], task["targets"]]),
        "loss_mask": torch.cat([torch.ones_like(text["targets"], dtype=torch.bool) if text_mask is None
                                else text_mask, task["loss_mask"]]),
        "lane": torch.cat([text["lane"], task["lane"] + task_lane_offset]),
        "new_stream": torch.cat([text["new_stream"], task["new_stream"]]),
        "step": text["step"],
    }
    if "segment" in text:
        out["segment"] = torch.cat([text["segment"], torch.zeros(n_task, dtype=torch.long)])
    if "resets" in text:
        task_resets = torch.zeros_like(task["targets"], dtype=torch.bool)
        task_resets[:, 0] = True  # each task row is a new stream, like a document that starts with the row
        out["resets"] = torch.cat([text["resets"], task_resets])
    assert out["input_ids"].shape[0] == n_text + n_task
    if task_share is not None:
        out["loss_mask"] = share_weights(out["loss_mask"], n_text=n_text, task_share=task_share)
    return out


class MixDataModule(UsesTokenizer, L.LightningDataModule):
    """Corpus rows and task rows in one batch (see the module's docstring). Both must use one tokenizer."""

    # task: a TaskDataModule (recurlen.evaluation.tasks.datamodules, which builds the mix: typed loosely here so that
    # the two modules do not import each other).
    def __init__(self, *, text: RecurlenDataModule, task: L.LightningDataModule,
                 task_share: float | None = None) -> None:
        super().__init__()
        if task_share is not None and not 0.0 < task_share < 1.0:
            raise ValueError(f"task.task_share={task_share!r} must be in (0, 1) or null (every scored token alike)")
        self.task_share = task_share
        if text.tokenizer.name != task.tokenizer.name:
            raise ValueError(f"the corpus rows use tokenizer {text.tokenizer.name!r} and the task rows "
                             f"{task.tokenizer.name!r}; a mix needs one tokenizer")
        if text.cfg.seq_len != task.seq_len:
            raise ValueError(f"the corpus rows are {text.cfg.seq_len} tokens and the task rows {task.seq_len}; a mix "
                             "needs one data.seq_len")
        self.text, self.task, self.tokenizer = text, task, text.tokenizer
        self._next_step = 0

    @property
    def text_rows(self) -> int:
        return self.text.cfg.batch_size

    @property
    def task_rows(self) -> int:
        return self.task.batch_size

    @property
    def lanes(self):
        return torch.cat([torch.as_tensor(self.text.lanes),
                          torch.as_tensor(self.task.lanes) + self._task_lane_offset()]).numpy()

    def _task_lane_offset(self) -> int:
        return self.text.num_global_lanes

    # ----- Lightning hooks: the halves are not attached to the Trainer, so they hear of it from here -----
    def _share_trainer(self) -> None:
        self.text.trainer = self.trainer
        self.task.trainer = self.trainer

    def prepare_data(self) -> None:
        self._share_trainer()
        self.text.prepare_data()

    def setup(self, stage: str | None = None) -> None:
        self._share_trainer()
        self.text.setup(stage)
        self.task.setup(stage)

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        trainer = self.trainer
        if trainer is not None and trainer.training and isinstance(batch, dict) and "step" in batch:
            self.record_step(int(batch["step"]))
        return batch

    # ----- training batches -----
    def train_batch(self, step: int) -> dict[str, torch.Tensor]:
        """This rank's batch at `step` (what the train loader yields then)."""
        if step < 0:
            raise ValueError(f"step={step} is negative; steps count from 0")
        return join_batches(self.text.train_batch(step), self.task.train_batch(step),
                            task_lane_offset=self._task_lane_offset(), task_share=self.task_share)

    def batch(self, step: int) -> dict[str, torch.Tensor]:  # the sampler interface TrainBatches calls
        return self.train_batch(step)

    def train_dataloader(self, *, start_step: int | None = None, num_steps: int | None = None) -> DataLoader:
        start = self._next_step if start_step is None else start_step
        dataset = TrainBatches(self, start_step=start, stop_step=None if num_steps is None else start + num_steps)
        return DataLoader(dataset, batch_size=None, num_workers=0)

    def val_dataloader(self) -> DataLoader:
        batches = list(self.text.val_dataloader()) + list(self.task.val_dataloader())
        return DataLoader(FixedBatches(batches), batch_size=None, num_workers=0)

    def long_validation_sequences(self, **kwargs) -> torch.Tensor:
        """The corpus DataModule's long held-out sequences (what the position-wise diagnostics read)."""
        return self.text.long_validation_sequences(**kwargs)

    # ----- resume -----
    def record_step(self, step: int) -> None:
        self._next_step = int(step) + 1

    @property
    def next_step(self) -> int:
        return self._next_step

    def state_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "next_step": self._next_step, "text": self.text.state_dict(),
                "task": self.task.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._next_step = int(state_dict["next_step"])
        # The halves warn about their own changed settings (seed, seq_len, rows) as they would alone.
        self.text.load_state_dict({**state_dict["text"], "next_step": self._next_step})
        self.task.load_state_dict({**state_dict["task"], "next_step": self._next_step})


__all__ = ["MixDataModule", "join_batches"]
