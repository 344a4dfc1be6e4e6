"""Pre-emption: on SIGTERM, SIGUSR1 or SIGINT finish the step, write a checkpoint, stop, exit non-zero.

Schedulers (Kubernetes, torchrun, SLURM without requeue) send SIGTERM, or SIGUSR1 shortly before a
time limit; Ctrl-C sends SIGINT. The signal handler only records the signal. At the end of the next
optimizer step every rank learns whether any rank was signalled (one all-reduce of a flag per step, so
a rank that got the signal first never waits alone in a collective), the checkpoint callback writes
last.ckpt with all ranks taking part (carried lane states are gathered from every rank), training
stops, and `run_finetune` raises `Interrupted`: the command exits with 128 + the signal number and says
the run is resumable. Rerunning the same command resumes exactly from that checkpoint.

The checkpoint comes first: a validation that was due at that step (or that Lightning would run because
training stops early) is skipped, since a scheduler's grace period may not cover it; the last step is no
exception (the run exits 128 + the signal there too, its validation skipped). A signal that arrives during a
validation pass lets that pass finish and stops right after it, without another training step.

Under SLURM with auto-requeue, SIGUSR1 and SIGTERM stay Lightning's: it writes hpc_ckpt_N.ckpt and
requeues the job, which resumes from it. A second signal of the same kind while the checkpoint is being
written takes the default action (the process ends at once).
"""

from __future__ import annotations

import logging
import os
import signal
import threading

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from recurlen.util.errors import Interrupted
from recurlen.util.writer_lock import release_all

log = logging.getLogger(__name__)

HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


class Preemption(Callback):
    """Turns the handled signals into 'checkpoint after this step, then stop' (see the module docstring)."""

    def __init__(self, *, keep_slurm_requeue: bool = False) -> None:
        # Under SLURM auto-requeue Lightning owns SIGUSR1 / SIGTERM (hpc checkpoint + requeue).
        self.signals = (signal.SIGINT,) if keep_slurm_requeue else HANDLED_SIGNALS
        self.received: int | None = None
        self.stopped_on: int | None = None
        self.stopped_at_step = 0
        self._previous: dict[int, object] = {}
        self._step_at_batch_start = 0
        self._validating = False
        self.stopped_after: str | None = None
        """What the stop came after: 'step' (a validation due then was skipped, so the resume runs it) or
        'validation'; None while no signal stopped the run."""

    def _handler(self, signum: int, frame) -> None:
        if self.received is not None:  # a second signal: do what the signal normally does, now
            release_all()  # the run directory's writer lock first: nobody has to wait for it to go stale
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.received = signum
        now = "the validation in progress" if self._validating else "this step"
        log.warning("received %s: finishing %s, then writing a checkpoint and stopping (no further validation)",
                    signal.Signals(signum).name, now)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Lightning registered its own handlers when fit began; these replace them for the training loop.
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in self.signals:
            self._previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._handler)
        if trainer.is_global_zero:
            log.info("training; on %s the run writes a checkpoint after the current step and stops (resumable)",
                     "/".join(signal.Signals(s).name for s in self.signals))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._step_at_batch_start = trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self._step_at_batch_start:  # mid gradient accumulation: not a step boundary
            return
        if self._stop_if_signalled(trainer, pl_module, after="step"):
            # Lightning validates when training stops early (and this step's validation may be due): the
            # checkpoint must not wait for it. Every rank skips it, as every rank stops at this step.
            loop = trainer.fit_loop.epoch_loop
            if hasattr(loop, "_skip_next_val"):
                loop._skip_next_val = True

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._validating = True

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._validating = False
        if trainer.state.fn == "fit":  # a signal during this validation: stop now rather than after another step
            self._stop_if_signalled(trainer, pl_module, after="validation")

    def _stop_if_signalled(self, trainer: L.Trainer, pl_module: L.LightningModule, *, after: str) -> bool:
        """Whether any rank was signalled (every rank calls this at the same point: it is a collective); if so,
        training stops and the checkpoint callback writes last.ckpt when it ends (RunCheckpoint.on_train_end)."""
        if trainer.sanity_checking:
            return False
        flag = torch.tensor(float(self.received or 0), device=pl_module.device)
        if trainer.world_size > 1:  # the signal of any rank stops every rank at the same step
            flag = _all_max(flag)
        signum = int(flag.item())
        if not signum:
            return False
        self.stopped_on, self.stopped_at_step, self.stopped_after = signum, trainer.global_step, after
        trainer.should_stop = True
        if trainer.is_global_zero:
            skipped = ", without the validation" if after == "step" else ""
            log.warning("stopping on %s after the %s of step %d: writing the checkpoint now%s",
                        signal.Signals(signum).name, after, trainer.global_step, skipped)
        return True

    def state_dict(self) -> dict:
        # Saved with the checkpoint written on the stop: recurlen.training.resume.revalidate_pending reads
        # `stopped_after` to run a validation the stop skipped, so the resumed run logs what an uninterrupted one does.
        return {"stopped_on": self.stopped_on, "stopped_at_step": self.stopped_at_step,
                "stopped_after": self.stopped_after}

    def load_state_dict(self, state_dict: dict) -> None:
        pass  # how the last run stopped says nothing about this one: a resumed run starts unsignalled

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self.on_train_end(trainer, pl_module)


def _all_max(flag: torch.Tensor) -> torch.Tensor:
    import torch.distributed as dist

    flag = flag.clone()
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return flag


__all__ = ["HANDLED_SIGNALS", "Interrupted", "Preemption"]
