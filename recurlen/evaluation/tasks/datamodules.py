"""Task DataModules: passkey / BABILong / copying / NIAH examples with the corpus DataModule's batch contract.

Batch (train and validation):
    input_ids   LongTensor (B, T)   T = data.seq_len; one example per row, left-aligned, padded (EOS, or the
                                    task's own pad token); copying can pack several examples in a row
    targets     LongTensor (B, T)   input_ids shifted by one
    loss_mask   BoolTensor (B, T)   the scored targets: the answer (and its EOS), or every real token
    lane        LongTensor (B,)     global lane of each row
    new_stream  BoolTensor (B,)     always True: every example is unrelated to the lane's previous one
    step        LongTensor ()       micro-step

Every example is a pure function of (data.seed, seed, step, global lane) -- or (.., validation batch, row)
for the fixed validation batches -- so resume needs only the next step, and ranks own lanes
[r * B, (r + 1) * B) as in the corpus DataModule. With state passing, a lane's carried state is the final
state of its previous, unrelated example (what the paper does for copying).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader

from recurlen.evaluation.tasks.common import TaskExample, rows_from_examples
from recurlen.training.data.datamodule import FixedBatches, TrainBatches
from recurlen.training.data.lanes import global_lanes
from recurlen.util.tokenizers import Tokenizer, UsesTokenizer, load_tokenizer

if TYPE_CHECKING:
    from recurlen.training.experiments.schema import ExperimentConfig

log = logging.getLogger(__name__)

STATE_VERSION = 1
_TRAIN, _VAL = 0, 1  # separate random streams: validation examples never appear in training
ExampleFn = Callable[[np.random.Generator], TaskExample]


class TaskDataModule(UsesTokenizer, L.LightningDataModule):
    """Batches of independent task examples; `make_example(rng)` draws one example at the training length."""

    def __init__(self, make_example: ExampleFn, *, tokenizer: Tokenizer, tokenizer_spec: str, seq_len: int,
                 batch_size: int, seed: int, data_seed: int = 0, loss_on: str = "answer", val_batches: int = 4,
                 task: str = "task", pad_id: int | None = None, rank: int | None = None,
                 world_size: int | None = None) -> None:
        super().__init__()
        if loss_on not in ("answer", "all"):
            raise ValueError(f"loss_on={loss_on!r} is unknown; allowed: ['answer', 'all']")
        self.make_example = make_example
        self.tokenizer, self.tokenizer_spec = tokenizer, tokenizer_spec
        self.seq_len, self.batch_size, self.seed, self.data_seed = seq_len, batch_size, seed, data_seed
        self.loss_on, self.val_batches, self.task = loss_on, val_batches, task
        self.pad_id = tokenizer.eos_id if pad_id is None else pad_id
        self.rank = 0 if rank is None else rank
        self.world_size = 1 if world_size is None else world_size
        global_lanes(self.rank, self.world_size, batch_size)  # validates rank / world_size
        self._next_step = 0
        self.make_example(np.random.default_rng(0))  # fail at construction, not at step 0, if the config cannot work

    @property
    def lanes(self) -> np.ndarray:
        return global_lanes(self.rank, self.world_size, self.batch_size)

    def setup(self, stage: str | None = None) -> None:
        trainer = self.trainer
        if trainer is not None:
            self.rank, self.world_size = trainer.global_rank, trainer.world_size

    def _batch(self, stream: int, index: int, lanes: np.ndarray, *, step: int) -> dict[str, torch.Tensor]:
        examples = [self.make_example(np.random.default_rng([self.data_seed, self.seed, stream, index, int(g)]))
                    for g in lanes]
        batch = rows_from_examples(examples, seq_len=self.seq_len, pad_id=self.pad_id, loss_on=self.loss_on)
        batch["lane"] = torch.as_tensor(lanes, dtype=torch.long).clone()
        batch["new_stream"] = torch.ones(len(lanes), dtype=torch.bool)
        batch["step"] = torch.tensor(step, dtype=torch.long)
        return batch

    def train_batch(self, step: int) -> dict[str, torch.Tensor]:
        """This rank's batch at `step` (what the train loader yields then)."""
        if step < 0:
            raise ValueError(f"step={step} is negative; steps count from 0")
        return self._batch(_TRAIN, step, self.lanes, step=step)

    def batch(self, step: int) -> dict[str, torch.Tensor]:  # the sampler interface TrainBatches calls
        return self.train_batch(step)

    def train_dataloader(self, *, start_step: int | None = None, num_steps: int | None = None) -> DataLoader:
        start = self._next_step if start_step is None else start_step
        dataset = TrainBatches(self, start_step=start, stop_step=None if num_steps is None else start + num_steps)
        return DataLoader(dataset, batch_size=None, num_workers=0)

    def val_dataloader(self) -> DataLoader:
        """val_batches fixed batches; rank r takes batches r, r + W, ... (the same count on every rank)."""
        per_rank = -(-self.val_batches // self.world_size)
        batches = [self._batch(_VAL, (self.rank + self.world_size * b) % max(1, self.val_batches),
                               np.arange(self.batch_size), step=b) for b in range(per_rank if self.val_batches else 0)]
        return DataLoader(FixedBatches(batches), batch_size=None, num_workers=0)

    # ----- resume -----
    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        trainer = self.trainer
        if trainer is not None and trainer.training and isinstance(batch, dict) and "step" in batch:
            self.record_step(int(batch["step"]))
        return batch

    def record_step(self, step: int) -> None:
        self._next_step = int(step) + 1

    @property
    def next_step(self) -> int:
        return self._next_step

    def state_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "task": self.task, "next_step": self._next_step, "seed": self.seed,
                "data_seed": self.data_seed, "seq_len": self.seq_len, "batch_size": self.batch_size,
                "world_size": self.world_size}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._next_step = int(state_dict["next_step"])
        now = self.state_dict()
        changed = {k: (state_dict[k], now[k]) for k in ("task", "seed", "data_seed", "seq_len", "batch_size",
                                                           "world_size") if k in state_dict and state_dict[k] != now[k]}
        if changed:
            log.warning("resuming %s data at step %d with changed settings %s (saved, now)", self.task,
                        self._next_step, changed)


def example_fn(cfg: ExperimentConfig, tokenizer: Tokenizer) -> ExampleFn:
    """The training-example generator of cfg.task.name at data.seq_len."""
    task, seq_len, eos = cfg.task.name, cfg.data.seq_len, tokenizer.eos_id
    if task == "passkey":
        from recurlen.evaluation.tasks.passkey import PasskeyBuilder

        builder = PasskeyBuilder(tokenizer, key_digits=cfg.task.passkey.key_digits)
        return lambda rng: builder.training_example(rng, seq_len=seq_len, eos_id=eos)
    if task == "babilong":
        from recurlen.evaluation.tasks.babilong import training_example_fn

        return training_example_fn(cfg.task.babilong, tokenizer, seq_len=seq_len)
    if task == "copying":
        from recurlen.evaluation.tasks.copying import CopyingFormat

        fmt = CopyingFormat(tokenizer, cfg.task.copying)
        return lambda rng: fmt.training_example(rng, seq_len=seq_len)
    if task == "niah":
        from recurlen.evaluation.tasks.niah import FillerHaystack, NiahBuilder, TextHaystack

        niah = NiahBuilder(tokenizer, cfg.task.niah)
        # Held-out text is never trained on: with haystack=heldout the examples hide in embedded text.
        hay = (FillerHaystack(tokenizer) if cfg.task.niah.haystack == "filler"
               else TextHaystack("embedded", tokenizer=tokenizer))
        return lambda rng: niah.training_example(rng, seq_len=seq_len, eos_id=eos, haystack=hay)
    from recurlen.evaluation.tasks.config import TASKS

    raise ValueError(f"task.name={task!r} has no training data; allowed: {list(TASKS)}")


def build_task_datamodule(cfg: ExperimentConfig) -> L.LightningDataModule:
    """The DataModule of cfg.task.name (the task runner passes it to recurlen.training.finetune.run_finetune); with
    task.text_rows, those rows of every batch read the corpus of cfg.data (recurlen.evaluation.tasks.mix)."""
    if cfg.task.text_rows:
        import dataclasses

        from recurlen.evaluation.tasks.mix import MixDataModule
        from recurlen.training.data.datamodule import RecurlenDataModule

        # TBTT walks the text rows' documents; every task row is a new stream, from zeros.
        text = RecurlenDataModule(dataclasses.replace(cfg.data, batch_size=cfg.task.text_rows))
        return MixDataModule(text=text, task=_examples(cfg, batch_size=cfg.data.batch_size - cfg.task.text_rows),
                             task_share=cfg.task.task_share)
    if cfg.intervention.name == "tbptt":
        # Every task row starts a new example (new_stream), so TBTT would reset every lane every step.
        raise ValueError(f"intervention tbptt needs documents that continue from step to step, but {cfg.task.name} "
                         "examples are independent; use state_passing (or none / random_noise / fitted_noise), or "
                         "follow the paper: post-train on the corpus with tbptt (`recurlen finetune "
                         "intervention=tbptt`), then fine-tune on the task from that run (model.pretrained=<run dir> "
                         "intervention=none), or mix corpus rows into the task's batches (task.text_rows=N): TBTT "
                         "then walks their documents")
    return _examples(cfg, batch_size=cfg.data.batch_size)


def _examples(cfg: ExperimentConfig, *, batch_size: int) -> TaskDataModule:
    tokenizer = load_tokenizer(cfg.data.tokenizer)
    loss_on = cfg.task.passkey.loss_on if cfg.task.name == "passkey" else "answer"
    pad_id = None
    if cfg.task.name == "copying":
        from recurlen.evaluation.tasks.copying import CopyingFormat

        pad_id = CopyingFormat(tokenizer, cfg.task.copying).pad_id
    return TaskDataModule(example_fn(cfg, tokenizer), tokenizer=tokenizer, tokenizer_spec=cfg.data.tokenizer,
                          seq_len=cfg.data.seq_len, batch_size=batch_size, seed=cfg.seed, data_seed=cfg.data.seed,
                          loss_on=loss_on, val_batches=cfg.task.val_batches, task=str(cfg.task.name), pad_id=pad_id)


__all__ = ["TaskDataModule", "build_task_datamodule", "example_fn"]
