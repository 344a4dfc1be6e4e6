"""Non-finite values injected into training at one optimizer step, for the fault tests (RECURLEN_FAULT, see
recurlen.util.faults).

The trainer gets this callback only when such a fault is asked for, and it installs its hooks when training
starts: a run without a fault has no fault code in its training step, gradient check or optimizer step.

  state   the final state of layer 0 (its recurrent part), as the model returns it in the training step
  loss    the step's logits, so its loss
  grad    a gradient inside a block, before the optimizer step (so the error can name its layer)
  weight  a weight, right after the optimizer step
"""

from __future__ import annotations

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
    def from_env(cls) -> InjectNonFinite | None:
        """The callback RECURLEN_FAULT asks this process for; None when it asks for none."""
        fault = faults.nan_fault()
        return None if fault is None else cls(*fault)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        model = pl_module.model
        if self.what == "state":
            self._wrap(trainer, model, "forward_hidden", lambda out: (out[0], _poison_first_layer(out[1])))
        elif self.what == "loss":
            self._wrap(trainer, model, "logits_from_hidden", lambda logits: logits * float("nan"))
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
