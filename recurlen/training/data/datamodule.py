"""The stateful DataModule: lanes of token segments whose position is a pure function of the step.

Batch contract (train; validation batches have the same keys):
    input_ids   LongTensor (B, T)   T = seq_len
    targets     LongTensor (B, T)   input_ids shifted by one (the segment has T + 1 tokens)
    lane        LongTensor (B,)     global lane of each row (validation: index of the held-out segment)
    new_stream  BoolTensor (B,)     the row does not continue the lane's previous segment: contiguous
                                    layout only at step 0, independent layout always, documents layout
                                    where a document (or the lane's slice of an epoch) starts, packed
                                    layout where the row starts one (validation: always)
    loss_mask   BoolTensor (B, T)   documents and packed layouts: the scored targets (a document's tail segment
                                    is padded after its EOS; packed: a document's first token is no target)
    segment     LongTensor (B,)     documents layout only: the row's segment index within its document (packed
                                    layout: how many earlier rows the row's first document spans)
    resets      BoolTensor (B, T)   packed layout only: where a document (or the lane's stream) starts; the
                                    model zeroes its state there (column 0 is new_stream, the intervention's)
    step        LongTensor ()       micro-step of this batch (validation: index of the batch)

Resume: the state is just the next step to yield. It is recorded when a batch reaches the training step
(`on_before_batch_transfer`, or `record_step` in a hand-written loop), not when a worker produces it, so
prefetching never runs it ahead. Use `Trainer(use_distributed_sampler=False)`: ranks pick their own lanes.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from typing import Any

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from recurlen.training.data.config import DataConfig
from recurlen.training.data.corpus import Corpus, load_corpus
from recurlen.training.data.heldout_fit import long_sequences
from recurlen.training.data.lanes import global_lanes
from recurlen.training.data.prefix_cache import PrefixCache, tokenize_needed
from recurlen.training.data.source_lanes import Grow, SourceOrderSampler, is_heldout
from recurlen.training.data.source_lanes import split as needed_split
from recurlen.training.data.stream import HeldOut, TrainSampler, make_batch
from recurlen.util.tokenizers import Tokenizer, UsesTokenizer, load_tokenizer

log = logging.getLogger(__name__)

STATE_VERSION = 1


class TrainBatches(IterableDataset):
    """Whole batches for steps start, start + 1, ... (forever, or up to `stop`).

    With n workers, worker w yields steps start + w, start + w + n, ...; the DataLoader takes one batch from
    each worker in turn, so the batches still arrive in step order.
    """

    def __init__(self, sampler: TrainSampler, *, start_step: int, stop_step: int | None = None) -> None:
        self.sampler, self.start_step, self.stop_step = sampler, start_step, stop_step

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        step = self.start_step + worker
        while self.stop_step is None or step < self.stop_step:
            yield self.sampler.batch(step)
            step += num_workers


class FixedBatches(IterableDataset):
    """A precomputed list of batches (validation); iterable so Lightning never wraps it in a sampler.

    No __len__: Lightning warns about any IterableDataset that has one.
    """

    def __init__(self, batches: list[dict[str, torch.Tensor]]) -> None:
        self.batches = batches

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return iter(self.batches)


class RecurlenDataModule(UsesTokenizer, L.LightningDataModule):
    """Train lanes, fixed held-out validation segments and long validation sequences from one corpus."""

    def __init__(self, cfg: DataConfig, *, rank: int | None = None, world_size: int | None = None,
                 steps: int | None = None) -> None:
        super().__init__()
        self.cfg, self.steps = cfg, steps
        self._tokenize_needed: bool | None = None
        self._prefix: PrefixCache | None = None
        self.tokenizer: Tokenizer = load_tokenizer(cfg.tokenizer)
        self.rank = 0 if rank is None else rank
        self.world_size = 1 if world_size is None else world_size
        global_lanes(self.rank, self.world_size, cfg.batch_size)  # validates rank / world_size
        self._corpus: Corpus | None = None
        self._sampler: TrainSampler | None = None
        self._heldout: HeldOut | None = None
        self._heldout_ids: np.ndarray | None = None
        self._long_val: dict[tuple[int, int, str], torch.Tensor] = {}
        self._next_step = 0

    # ----- Lightning hooks -----
    def prepare_data(self) -> None:
        # Runs once per node before setup on every rank: the others then find the finished cache.
        if self._needed():
            self._grow(self._trainer_world() * self.cfg.batch_size)(self._run_steps())
        else:
            load_corpus(self.cfg, self.tokenizer)

    # ----- tokenize='needed' (source_lanes.py): the cache covers what the run's steps read -----
    def _needed(self) -> bool:
        if self._tokenize_needed is None:
            self._tokenize_needed = tokenize_needed(self.cfg)
        return self._tokenize_needed

    def _trainer_world(self) -> int:
        return self.trainer.world_size if self.trainer is not None else self.world_size

    def _run_steps(self) -> int:
        """Micro-steps the run reads: the trainer's max_steps x accumulation, or `steps` given to the constructor
        (1 when neither is known: the sampler then extends the cache as steps are read)."""
        trainer = self.trainer
        if trainer is not None and trainer.max_steps and trainer.max_steps > 0:
            return int(trainer.max_steps) * int(trainer.accumulate_grad_batches)
        return self.steps or 1

    def _grow(self, num_global_lanes: int) -> Grow:
        if self._prefix is None:
            self._prefix = PrefixCache(self.cfg, self.tokenizer)
        return Grow(self._prefix, self.cfg, num_global_lanes=num_global_lanes)

    def setup(self, stage: str | None = None) -> None:
        trainer = self.trainer
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (self.rank, self.world_size)
        if self._sampler is not None and (rank, world) == (self.rank, self.world_size):
            return
        cfg = self.cfg
        lanes = global_lanes(rank, world, cfg.batch_size)
        if self._needed():
            grow = self._grow(cfg.batch_size * world)
            self._corpus = grow(self._run_steps())
            heldout_ids = needed_split(self._corpus, cfg)[1]
            if heldout_ids is None:  # the source ended before the held-out set was complete
                heldout_ids = np.flatnonzero(is_heldout(self._corpus.doc_hash, cfg.val_fraction))
            sampler = SourceOrderSampler(self._corpus, cfg, lanes=lanes, num_global_lanes=cfg.batch_size * world,
                                         eos_id=self.eos_id, grow=grow)
        else:
            if self._corpus is None:
                self._corpus = load_corpus(cfg, self.tokenizer)
            train_ids, heldout_ids = self._corpus.split(cfg.val_fraction)
            sampler = TrainSampler(self._corpus, train_ids, lanes=lanes, num_global_lanes=cfg.batch_size * world,
                                   seq_len=cfg.seq_len, layout=cfg.layout, seed=cfg.seed, eos_id=self.eos_id)
        heldout, long_val = None, {}
        # Fail now, not hours in at the first validation, if the held-out data cannot serve the config.
        if cfg.val_segments > 0 or cfg.val_sequences > 0:
            heldout = HeldOut(self._corpus, heldout_ids, eos_id=self.eos_id, val_fraction=cfg.val_fraction)
            if cfg.val_segments > 0:
                heldout.segments(1, cfg.seq_len)
            if cfg.val_sequences > 0:
                key = (cfg.val_sequences, cfg.long_val_length, cfg.val_mode)
                # The same check, and the same line naming what would fit, as the dry run's (heldout_fit).
                long_val[key] = torch.from_numpy(long_sequences(heldout, cfg, num_documents=self._corpus.num_documents))
        self.rank, self.world_size = rank, world
        self._sampler, self._heldout_ids, self._heldout, self._long_val = sampler, heldout_ids, heldout, long_val

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        # The batch is about to enter the training step: from now on it counts as consumed. Reading the step
        # here (still on the CPU) avoids a device sync.
        trainer = self.trainer
        if trainer is not None and trainer.training and isinstance(batch, dict) and "step" in batch:
            self.record_step(int(batch["step"]))
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "next_step": self._next_step, "seed": self.cfg.seed,
                "layout": self.cfg.layout, "seq_len": self.cfg.seq_len, "batch_size": self.cfg.batch_size,
                "world_size": self.world_size, "corpus": self._corpus.meta.get("key") if self._corpus else None,
                "tokenize": None if self._tokenize_needed is None else "needed" if self._tokenize_needed else "all"}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._next_step = int(state_dict["next_step"])
        now = self.state_dict()
        changed = {k: (state_dict[k], now[k]) for k in ("seed", "layout", "seq_len", "batch_size", "world_size",
                                                           "corpus", "tokenize")
                   if k in state_dict and now[k] is not None and state_dict[k] != now[k]}
        if changed:
            log.warning("resuming data at step %d with changed settings %s (saved, now): lanes will not read what "
                        "an uninterrupted run would have read", self._next_step, changed)

    # ----- train stream -----
    @property
    def num_global_lanes(self) -> int:
        return self.cfg.batch_size * self.world_size

    @property
    def lanes(self) -> np.ndarray:
        """This rank's global lanes."""
        return global_lanes(self.rank, self.world_size, self.cfg.batch_size)

    @property
    def next_step(self) -> int:
        """The step the next train_dataloader() starts at (what state_dict saves)."""
        return self._next_step

    def set_step(self, step: int) -> None:
        """Start the train stream at `step` (the next train_dataloader() begins there)."""
        if step < 0:
            raise ValueError(f"step={step} is negative; steps count from 0")
        self._next_step = int(step)

    def record_step(self, step: int) -> None:
        """Batch `step` was consumed; a hand-written loop (no Trainer) calls this to keep state_dict right."""
        self._next_step = int(step) + 1

    def train_batch(self, step: int) -> dict[str, torch.Tensor]:
        """The batch of `step` for this rank, computed directly (what the train loader yields at that step)."""
        return self.sampler.batch(step)

    @property
    def corpus(self) -> Corpus:
        """The tokenized corpus (set up on first use)."""
        if self._corpus is None:
            self.setup()
        assert self._corpus is not None
        return self._corpus

    @property
    def sampler(self) -> TrainSampler | SourceOrderSampler:
        if self._sampler is None:
            self.setup()
        assert self._sampler is not None
        return self._sampler

    def train_dataloader(self, *, start_step: int | None = None, num_steps: int | None = None) -> DataLoader:
        start = self._next_step if start_step is None else start_step
        dataset = TrainBatches(self.sampler, start_step=start,
                               stop_step=None if num_steps is None else start + num_steps)
        return self._loader(dataset, num_workers=self.cfg.num_workers)

    def _loader(self, dataset: IterableDataset, *, num_workers: int) -> DataLoader:
        return DataLoader(dataset, batch_size=None, num_workers=num_workers,
                          pin_memory=self.cfg.pin_memory and torch.cuda.is_available())

    # ----- validation -----
    @property
    def heldout(self) -> HeldOut:
        if self._heldout is None:
            self.sampler  # noqa: B018 (runs setup, which splits the corpus)
            assert self._heldout_ids is not None
            self._heldout = HeldOut(self.corpus, self._heldout_ids, eos_id=self.eos_id,
                                    val_fraction=self.cfg.val_fraction)
        return self._heldout

    def val_dataloader(self) -> DataLoader:
        """cfg.val_segments fixed held-out segments; rank r gets segments r, r + W, ... (wrapping, so every
        rank runs the same number of batches, as DistributedSampler does)."""
        num, seq_len, bs = self.cfg.val_segments, self.cfg.seq_len, self.cfg.batch_size
        if num == 0:
            return self._loader(FixedBatches([]), num_workers=0)
        segments = self.heldout.segments(num, seq_len)
        per_rank = math.ceil(num / self.world_size)
        index = (self.rank + self.world_size * np.arange(per_rank)) % num
        batches = [make_batch(segments[index[i:i + bs]], lanes=index[i:i + bs], step=b, new_stream=True)
                   for b, i in enumerate(range(0, per_rank, bs))]
        return self._loader(FixedBatches(batches), num_workers=0)

    def long_validation_sequences(self, *, length: int | None = None, num: int | None = None,
                                  mode: str | None = None) -> torch.Tensor:
        """LongTensor (num, length) of held-out tokens, identical in every run and on every rank; defaults
        from cfg.val_sequences / val_length / val_mode."""
        length = self.cfg.long_val_length if length is None else length
        num = self.cfg.val_sequences if num is None else num
        mode = self.cfg.val_mode if mode is None else mode
        if (num, length, mode) not in self._long_val:
            seqs = self.heldout.long_sequences(num, length, mode)
            self._long_val[(num, length, mode)] = torch.from_numpy(seqs)
        return self._long_val[(num, length, mode)].clone()


__all__ = ["FixedBatches", "RecurlenDataModule", "TrainBatches"]
