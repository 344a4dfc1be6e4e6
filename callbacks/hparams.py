"""The run's row in TensorBoard's HParams tab: its settings next to the diagnostics' headline numbers.

After the first real validation (when the diagnostics have named their tags), rank 0 writes the run's
settings (model, intervention, lr, steps, T, reset_prob, ...) with the metric tags of the diagnostics
(loss in [0,T), full - reset per position bin, EffRem at fractions of T, val/loss). TensorBoard shows each
metric's latest value, so with `--logdir runs` the HParams tab is a table of all runs, sortable and
filterable by intervention.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import lightning.pytorch as pl
from recurlen.callbacks.diagnostic import DiagnosticCallback, tensorboard_writers

from recurlen.util.tensorboard import write_hparams


class HParamsTable(pl.Callback):
    """Writes the run's HParams row once per process, after the first validation with diagnostics."""

    def __init__(self, hparams: Mapping[str, object], diagnostics: Sequence[DiagnosticCallback], *,
                 extra_metrics: Sequence[str] = ("val/loss",)) -> None:
        self.hparams = dict(hparams)
        self.diagnostics = list(diagnostics)
        self.extra_metrics = list(extra_metrics)
        self.written = False

    def metric_tags(self) -> list[str]:
        tags = [tag for d in self.diagnostics for tag in d.hparam_metrics()]
        return list(dict.fromkeys([*tags, *self.extra_metrics]))

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.written or trainer.sanity_checking or not any(d.hparam_metrics() for d in self.diagnostics):
            return
        for writer in tensorboard_writers(trainer):
            write_hparams(writer, self.hparams, self.metric_tags())
        self.written = True
