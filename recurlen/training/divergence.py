"""Where a diverged run went wrong, and advice that works: the checkpoint from *before* the divergence began.

A NaN rarely comes from nowhere. A rate that is too high first makes the loss climb and the gradient norm explode
for several steps; only then does a value overflow. The checkpoints written in between hold finite weights that
are already diverged: resuming one of them fails again at any rate (at lr 50 a nano run's step-22 weights have
max |w| 115, and their gradient is non-finite at lr 1e-4 too). So every step's loss and gradient norm is kept
(`StepHealth`, saved with each checkpoint, restored on resume), and when a step goes non-finite, `onset` finds
where the unbroken run of unhealthy steps before it began. `plan_recovery` then picks the newest intact
checkpoint from before that step, or none (start over), and the rate to use from there.

Unhealthy, for a step: a loss more than LOSS_RISE times the best loss of the steps before it, or a gradient norm
more than GRAD_RISE times the median of the healthy steps before it. Both factors are far outside what noise
does in a run that trains, so a run that trains is never called diverged; the price is that a slow drift is
caught only once it is large, which costs at most a few extra steps of rollback.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from pathlib import Path
from statistics import median

import lightning as L
import torch

from recurlen.training.experiments.compose import resolved_config
from recurlen.training.experiments.schema import ExperimentConfig
from recurlen.training.optim import OptimConfig
from recurlen.training.resume import Damaged, validate_checkpoint
from recurlen.training.run_dir import LAST_CHECKPOINT, RunDir

log = logging.getLogger(__name__)

LOSS_RISE = 1.5
"""A loss this many times the best loss so far is a divergence, not noise (training noise is a few percent)."""
GRAD_RISE = 100.0
"""A gradient norm this many times the typical (median healthy) norm so far is an explosion."""
WINDOW = 4096
"""Steps of history kept (in memory and in each checkpoint): enough to see any divergence's start."""
RATE_FACTOR = 4.0
"""The advice lowers the rate by this factor (and to at most the model's default rate when starting over)."""


@dataclass(frozen=True)
class Health:
    step: int
    loss: float
    grad_norm: float


class StepHealth(L.Callback):
    """Keeps every optimizer step's training loss and gradient norm (the newest WINDOW steps), in checkpoints too.

    The values are kept as tensors and read on the host only when a checkpoint is written or a step goes
    non-finite, so this adds no synchronisation to a step."""

    def __init__(self) -> None:
        self._pending: dict[int, tuple[torch.Tensor | float, torch.Tensor | float]] = {}
        self._step: int | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._step = trainer.global_step  # the step the training_step reports (before the optimizer increments it)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is None or self._step is None:
            return
        grad = getattr(pl_module, "last_grad_norm", None)
        self._pending[self._step] = (loss.detach(), grad if grad is not None else float("nan"))
        if len(self._pending) > WINDOW:
            del self._pending[min(self._pending)]

    def history(self) -> list[Health]:
        return [Health(step, float(loss), float(grad)) for step, (loss, grad) in sorted(self._pending.items())]

    def state_dict(self) -> dict:
        rows = self.history()
        return {"step": torch.tensor([h.step for h in rows], dtype=torch.long),
                "loss": torch.tensor([h.loss for h in rows], dtype=torch.float64),
                "grad_norm": torch.tensor([h.grad_norm for h in rows], dtype=torch.float64)}

    def load_state_dict(self, state_dict: dict) -> None:
        steps, losses, grads = (state_dict[k].tolist() for k in ("step", "loss", "grad_norm"))
        self._pending = {int(s): (float(loss), float(g)) for s, loss, g in zip(steps, losses, grads)}


def onset(history: list[Health], failed_step: int) -> tuple[int, str]:
    """The first step of the unbroken run of unhealthy steps that ends at failed_step, and what showed it.

    failed_step itself when every step before it was healthy (a sudden NaN)."""
    earlier = [h for h in history if h.step < failed_step]
    best = math.inf
    healthy_grads: list[float] = []
    verdicts: list[tuple[Health, str]] = []  # (step, why unhealthy; '' when healthy)
    for h in earlier:
        why = ""
        if not math.isfinite(h.loss):
            why = "non-finite loss"
        elif math.isfinite(best) and h.loss > LOSS_RISE * best:
            why = f"loss {h.loss:.4g} against a best of {best:.4g}"
        elif healthy_grads and math.isfinite(h.grad_norm) and h.grad_norm > GRAD_RISE * median(healthy_grads):
            why = f"gradient norm {h.grad_norm:.4g} against a typical {median(healthy_grads):.4g}"
        verdicts.append((h, why))
        if not why:
            best = min(best, h.loss)
            if math.isfinite(h.grad_norm):
                healthy_grads.append(h.grad_norm)
    start, reason = failed_step, ""
    for h, why in reversed(verdicts):
        if not why:
            break
        start, reason = h.step, why
    return start, reason


@dataclass(frozen=True)
class Recovery:
    """What to do after a non-finite step: resume from `checkpoint` (None: start over) at `lr`."""

    failed_step: int
    onset: int
    reason: str
    """What showed the divergence at its first step ('' when the failure came without warning)."""
    checkpoint: str | None
    checkpoint_step: int | None
    lr: float
    old_lr: float

    def describe(self) -> str:
        if self.reason:
            began = f"the run began to diverge at step {self.onset} ({self.reason})"
        else:
            began = f"the steps before {self.failed_step} were healthy"
        if self.checkpoint is None:
            return (f"{began}, before any checkpoint that could be resumed: the checkpoints after it hold weights that "
                    f"are already diverged; start over with a lower rate (optim.lr={self.lr:.3g} instead of "
                    f"{self.old_lr:.3g})")
        return (f"{began}; the newest checkpoint from before it is {self.checkpoint} (step {self.checkpoint_step}): "
                f"resume from it with a lower rate (optim.lr={self.lr:.3g} instead of {self.old_lr:.3g})")

    def history_entry(self) -> dict:
        """What config_history.yaml records about an automatic rollback (trainer.on_nonfinite=rollback)."""
        entry = {"event": "rollback", "failed_step": self.failed_step, "divergence_began": self.onset,
                 "signs": self.reason or "none before the failure",
                 "lr": {"from": self.old_lr, "to": self.lr}}
        if self.checkpoint is None:
            entry["restarted_from"] = "the starting weights (no checkpoint from before the divergence)"
        else:
            entry["restarted_from"] = self.checkpoint
            entry["skipped_batches"] = f"{self.checkpoint_step + 1}..{self.failed_step}"
        return entry

    def overrides(self) -> list[str]:
        """The settings that carry out this advice on the command line."""
        resume = f"resume={self.checkpoint}" if self.checkpoint else "resume=archive"
        return [f"optim.lr={self.lr:.3g}", resume]


def plan_recovery(run: RunDir, history: list[Health], *, failed_step: int, lr: float,
                  default_lr: float | None = None) -> Recovery:
    """Where to go back to after failed_step went non-finite: the newest intact checkpoint of the run whose step is
    before the divergence's onset, and a rate RATE_FACTOR lower (starting over: also at most default_lr, the
    model's own rate, when lr is far above it)."""
    start, reason = onset(history, failed_step)
    chosen: tuple[str, int] | None = None
    for path, step in _by_step_preferring_step_files(run):
        if step is None or step >= start:
            continue
        try:
            validate_checkpoint(path)
        except Damaged:
            continue
        chosen = (str(path), step)
        break
    rate = lr / RATE_FACTOR
    if chosen is None and default_lr is not None:
        rate = min(rate, default_lr)
    return Recovery(failed_step=failed_step, onset=start, reason=reason, checkpoint=chosen[0] if chosen else None,
                    checkpoint_step=chosen[1] if chosen else None, lr=rate, old_lr=lr)


def model_default_lr(cfg: ExperimentConfig) -> float:
    """The rate this model post-trains at by default: its pre-training peak rate x optim.lr_from_pretrain when both
    are known (experiments.compose), else OptimConfig's default."""
    if cfg.model.pretrain_lr is not None and cfg.optim.lr_from_pretrain is not None:
        return float(cfg.model.pretrain_lr) * float(cfg.optim.lr_from_pretrain)
    return OptimConfig().lr


def with_lr(cfg: ExperimentConfig, lr: float) -> tuple[ExperimentConfig, dict]:
    """cfg with optim.lr set to lr, and its resolved form (what config.yaml records)."""
    changed = replace(cfg, optim=replace(cfg.optim, lr=lr))
    return changed, resolved_config(changed)


class SkipBatches(L.Callback):
    """After a rollback: the train stream starts at `step` (set once the checkpoint's data position is restored,
    before the loader is built), so the batches between the checkpoint and the failed step are not read again."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_fit_start(self, trainer, pl_module) -> None:
        datamodule = trainer.datamodule
        if datamodule is not None and hasattr(datamodule, "set_step"):
            datamodule.set_step(self.step)


def _by_step_preferring_step_files(run: RunDir) -> list[tuple[Path, int | None]]:
    """The run's checkpoints, furthest-trained first; among equals the step=N file before last.ckpt, which later
    training replaces (advice must name a file that stays)."""
    entries = run.checkpoint_steps()
    return sorted(entries, key=lambda e: (-1 if e[1] is None else e[1], e[0].name != LAST_CHECKPOINT), reverse=True)


__all__ = ["GRAD_RISE", "LOSS_RISE", "RATE_FACTOR", "WINDOW", "Health", "Recovery", "SkipBatches", "StepHealth",
           "model_default_lr", "onset", "plan_recovery", "with_lr"]
