"""Faults injected into training at one optimizer step, for the fault tests (RECURLEN_FAULT, see
recurlen.util.faults): a non-finite value (InjectNonFinite), or a signal / kill -9 at a chosen moment of a training
step or of a validation run (InterruptRun).

The trainer gets one of these callbacks only when such a fault is asked for (`from_env`), and InjectNonFinite
installs its hooks when training starts: a run without a fault has no fault code in its training step, gradient
check, optimizer step or validation.

Non-finite values:

  state   the final state of layer 0 (its recurrent part), as the model returns it in the training step
  loss    the step's final hidden states (the LM head's input), so its logits and its loss, on either head loss
          path (trainer.head_loss: the plain one makes the logits, the chunked one never does)
  grad    a gradient inside a block, before the optimizer step (so the error can name its layer)
  weight  a weight, right after the optimizer step
"""

from __future__ import annotations

import os
from collections.abc import Callable

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from recurlen.models.state import LayeredState
from recurlen.util import faults


class InjectNonFinite(Callback):
    """Makes `what` non-finite at optimizer step `step` (see the module docstring)."""

    def __init__(self, step: int, what: str) -> None:
        if what not in faults.NAN_TARGETS:
            raise ValueError(f"what={what!r} is unknown; allowed: {list(faults.NAN_TARGETS)}")
        self.step, self.what = step, what
        self._undo: list[Callable[[], None]] = []

    @classmethod
    def from_env(cls) -> Callback | None:
        """The callback RECURLEN_FAULT asks this process for, of either kind (see `from_env` of this module, which
        the trainer may call instead); None when it asks for none."""
        return from_env()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        model = pl_module.model
        if self.what == "state":
            self._wrap(trainer, model, "forward_hidden", lambda out: (out[0], _poison_first_layer(out[1])))
        elif self.what == "loss":
            # The head's input, not its logits: the chunked head loss makes no logits (recurlen.models.head_loss)
            self._wrap(trainer, model, "forward_hidden", lambda out: (out[0] * float("nan"), *out[1:]))
        elif self.what == "weight":
            def poison_weight(optimizer, args, kwargs) -> None:
                if trainer.global_step == self.step:  # the step's counter moves on only after this hook
                    with torch.no_grad():
                        next(iter(model.parameters())).view(-1)[0] = float("nan")

            self._undo.append(trainer.optimizers[0].register_step_post_hook(poison_weight).remove)

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        # Callbacks run this hook before the LightningModule's, whose gradient check then finds the NaN.
        if self.what != "grad" or trainer.global_step != self.step:
            return
        named = [(n, p.grad) for n, p in pl_module.model.named_parameters() if p.grad is not None]
        if named:  # a gradient inside a block, to name its layer
            next((g for n, g in named if ".layers." in f".{n}"), named[-1][1]).view(-1)[0] = float("nan")

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        while self._undo:
            self._undo.pop()()

    def _wrap(self, trainer: L.Trainer, model: torch.nn.Module, method: str, poison: Callable) -> None:
        """Let model.<method> return poison(its output) in the training forward of the fault's step."""
        original, own = getattr(model, method), method in vars(model)  # own: another wrapper was there first

        def wrapped(*args, **kwargs):
            out = original(*args, **kwargs)
            return poison(out) if model.training and trainer.global_step == self.step else out

        setattr(model, method, wrapped)  # an instance attribute: deleting it brings the class's method back
        self._undo.append(lambda: setattr(model, method, original) if own else delattr(model, method))


class InterruptRun(Callback):
    """Sends `signum` to this process once, at `moment` of the training step taken while global_step is `step`
    (point=train) or of the validation run after `step` optimizer steps (point=validation).

    A signal sent to oneself is delivered before os.kill returns, so its handler (recurlen.training.preemption)
    runs exactly there: the moment a scheduler's signal would hit, made reproducible."""

    def __init__(self, point: str, step: int, moment: str, signum: int) -> None:
        if point not in faults.RUN_POINTS or moment not in faults.MOMENTS[point]:
            raise ValueError(f"point={point!r}, moment={moment!r} is unknown; allowed: {faults.MOMENTS}")
        self.point, self.step, self.moment, self.signum = point, step, moment, signum
        self._sent = False

    def _maybe(self, trainer: L.Trainer, point: str, moment: str, *, steps_taken: int = 0) -> None:
        """steps_taken: how far global_step has moved on since the step began (1 once its update is done)."""
        if (self._sent or (point, moment) != (self.point, self.moment) or trainer.sanity_checking
                or trainer.global_step - steps_taken != self.step):
            return
        self._sent = True  # once: a second handled signal would end the process at once, another fault
        os.kill(os.getpid(), self.signum)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._maybe(trainer, "train", "batch_start")

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self._maybe(trainer, "train", "after_backward")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._maybe(trainer, "train", "batch_end", steps_taken=1)

    def on_validation_start(self, trainer, pl_module) -> None:
        self._maybe(trainer, "validation", "start")

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._maybe(trainer, "validation", "batch")

    def on_validation_end(self, trainer, pl_module) -> None:
        self._maybe(trainer, "validation", "end")


def from_env() -> Callback | None:
    """The fault callback RECURLEN_FAULT asks this process for: InjectNonFinite, InterruptRun, or None (a fault in
    a file write is injected by recurlen.util.atomic_files, without a callback)."""
    nan = faults.nan_fault()
    if nan is not None:
        return InjectNonFinite(*nan)
    run = faults.run_fault()
    return None if run is None else InterruptRun(*run)


def _poison_first_layer(state: LayeredState) -> LayeredState:
    """The state with layer 0 of its recurrent part made NaN."""
    part = state.RECURRENT[0]

    def poison(name: str, t: torch.Tensor) -> torch.Tensor:
        if name != part:
            return t
        mask = torch.zeros(t.shape[0], *([1] * (t.dim() - 1)), dtype=torch.bool, device=t.device)
        mask[0] = True
        return torch.where(mask, torch.full_like(t, float("nan")), t)

    return state._map(poison)
