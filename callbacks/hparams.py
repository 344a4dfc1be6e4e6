"""The run's row in TensorBoard's HParams tab: its settings next to the diagnostics' headline numbers.

After the first real validation (when the diagnostics have named their tags), rank 0 writes the run's
settings (run, intervention, T, data and held-out sequences, model, lr, steps, reset_prob, ...) with the metric
tags of the diagnostics. The columns that answer "does it length-generalize" come first: full - reset in
[4T,8T), [8T,16T), [16T,32T), then the in-context loss in [0,T), then the rest (full - reset nearer T, EffRem at
fractions of T, val/loss); at 1600 px TensorBoard shows the first few metric columns next to the settings and the
rest off-screen.
TensorBoard shows each metric's latest value, so with `--logdir runs` the HParams tab is a table of all runs,
sortable and filterable by intervention.

A resumed run writes its row again at the start, with the settings it runs with now (a changed max_steps,
lr, ...) and the columns of the earlier row, and again after its first validation: the row lives in an event
file of its own that each process replaces (recurlen.util.tensorboard.write_hparams).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import lightning.pytorch as pl
from recurlen.callbacks.diagnostic import DiagnosticCallback, tensorboard_writers

from recurlen.util.tensorboard import plain_bin, read_hparams, write_hparams

FIRST_FAR_BIN = 4
"""full - reset from [4T,8T) on leads the table: nearer T even a model that fails is still close to 0."""
_BIN_TAG = re.compile(r"^(?P<prefix>.*)/(?P<kind>[a-z_]+)@(?P<bin>\[(?P<start>\d+)T?,\d+T\))$")
HEADINGS = {"full_minus_reset": "full - reset", "loss": "loss", "ppl": "ppl"}


def _parse(tag: str) -> tuple[str, int] | None:
    """('full_minus_reset', 4) for '.../full_minus_reset@[04T,08T)'; None for a tag that is no bin in units of T."""
    m = _BIN_TAG.match(tag)
    return None if m is None else (m["kind"], int(m["start"]))


def column_order(tags: Sequence[str]) -> list[str]:
    """full - reset of the bins from FIRST_FAR_BIN x T on (position order), the in-context loss, then the rest."""
    far = [t for t in tags if (p := _parse(t)) and p[0] == "full_minus_reset" and p[1] >= FIRST_FAR_BIN]
    in_context = [t for t in tags if (p := _parse(t)) and p[0] == "loss" and p[1] == 0]
    return list(dict.fromkeys([*far, *in_context, *tags]))


def heading(tag: str) -> str:
    """A short column heading: 'val full - reset [4T,8T)' for 'val/full_minus_reset@[04T,08T)'; other tags as they
    are.

    TensorBoard sizes a column by its heading, and the tags' long forms pushed the columns past T off-screen. The
    'val' says where the number comes from: the training-time validation on the run's own held-out sequences (the
    row's `data` column), which are not the sequences `recurlen eval` and the demo's report measure (a report's
    number and this column can differ: docs/dashboards.md)."""
    m = _BIN_TAG.match(tag)
    if m is None or m["kind"] not in HEADINGS:
        return tag
    return f"{m['prefix']} {HEADINGS[m['kind']]} {plain_bin(m['bin'])}"


class HParamsTable(pl.Callback):
    """Writes the run's HParams row: at the start of a resumed run, and after the first validation with diagnostics."""

    def __init__(self, hparams: Mapping[str, object], diagnostics: Sequence[DiagnosticCallback], *,
                 extra_metrics: Sequence[str] = ("val/loss",)) -> None:
        self.hparams = dict(hparams)
        self.diagnostics = list(diagnostics)
        self.extra_metrics = list(extra_metrics)
        self.written = False

    def metric_tags(self) -> list[str]:
        tags = [tag for d in self.diagnostics for tag in d.hparam_metrics()]
        return column_order(list(dict.fromkeys([*tags, *self.extra_metrics])))

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # A resume: the row of the earlier process shows its settings until this one validates (maybe hours
        # from now, or never when it only has a few steps left), so it is replaced now with today's settings.
        for writer in tensorboard_writers(trainer):
            earlier = read_hparams(writer.get_logdir())
            if earlier is not None and earlier[0] != self.hparams:
                write_hparams(writer.get_logdir(), self.hparams, earlier[1])

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.written or trainer.sanity_checking or not any(d.hparam_metrics() for d in self.diagnostics):
            return
        for writer in tensorboard_writers(trainer):
            write_hparams(writer.get_logdir(), self.hparams, {tag: heading(tag) for tag in self.metric_tags()})
        self.written = True
