"""How many steps a run trains and about how long they take, said in two log lines before the steps run out.

The first line, when training starts, gives the steps (and where a resumed run starts) and the validations due. The
second, once a few steps have run, gives the time: the seconds per step measured on those steps (the first step,
which pays for warm-up, is left out, and so is a validation that ran meanwhile) times the steps left. Validations are
not in that time: a validation pass costs what it costs (its own bar shows it), and the line says how many are due.
"""

from __future__ import annotations

import logging
import time

import lightning as L
from lightning.pytorch.callbacks import Callback

log = logging.getLogger(__name__)

TIMED_STEPS = 3
"""Optimizer steps timed after the first one before the estimate is said."""


def duration(seconds: float) -> str:
    """'40 s', '3.5 min', '2.1 h'."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def validations_due(start: int, max_steps: int, every: int) -> int:
    """Validation passes after step `start` up to max_steps, as recurlen.training.finetune.build_trainer schedules
    them: at every multiple of `every` (every = 0, or more than max_steps: once, at the end). Lightning runs none at
    a last step off that grid."""
    if max_steps <= start:
        return 0
    every = max_steps if every <= 0 or every > max_steps else every
    return max_steps // every - start // every


class Pace(Callback):
    """Says the steps a run trains when it starts and, after TIMED_STEPS more steps, about how long they take."""

    def __init__(self, *, val_every_n_steps: int, validates: bool, timed_steps: int = TIMED_STEPS,
                 clock=time.perf_counter) -> None:
        self.val_every_n_steps, self.validates = val_every_n_steps, validates
        self.timed_steps, self.clock = timed_steps, clock
        self.start_step = 0
        self._mark: tuple[int, float] | None = None  # (step, time) at the end of the first step of this process
        self._validating: float | None = None
        self._validation_s = 0.0  # spent validating since the mark
        self.said = False

    def _validations(self, trainer: L.Trainer, after: int) -> str:
        if not self.validates:
            return "no validation (data.val_segments=0, data.val_sequences=0)"
        every = self.val_every_n_steps
        n = validations_due(after, trainer.max_steps, every)
        if n == 0:
            return "no validation left"
        at_end = every <= 0 or every >= trainer.max_steps
        return f"{n} validation{'s' if n != 1 else ''}" + (" (at the end)" if at_end else f" (every {every} steps)")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.start_step = trainer.global_step
        if not trainer.is_global_zero:
            return
        left = trainer.max_steps - self.start_step
        where = f", from step {self.start_step} (resumed)" if self.start_step else ""
        timed = self.timed_steps + 1
        later = f"; the time they take is said after the first {timed}" if left > timed else ""
        log.info("training %d step%s to step %d%s, %s%s", left, "s" if left != 1 else "", trainer.max_steps, where,
                 self._validations(trainer, self.start_step), later)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch,
                           batch_idx: int) -> None:
        step = trainer.global_step
        if self.said or not trainer.is_global_zero or step == self.start_step:
            return
        if self._mark is None:  # the end of this process's first step: warm-up is behind it
            self._mark = (step, self.clock())
            return
        first, since = self._mark
        if step - first < self.timed_steps:
            return
        per_step = (self.clock() - since - self._validation_s) / (step - first)
        left = trainer.max_steps - step
        self.said = True
        if left <= 0:
            return
        log.info("about %s for the %d step%s left (%.3g s per step over steps %d-%d), plus %s",
                 duration(left * per_step), left, "s" if left != 1 else "", per_step, first + 1, step,
                 self._validations(trainer, step - 1))  # this step's validation runs after this hook

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._validating = self.clock()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._validating is not None and self._mark is not None:
            self._validation_s += self.clock() - self._validating
        self._validating = None


__all__ = ["TIMED_STEPS", "Pace", "duration", "validations_due"]
