"""metrics.csv: every scalar a run logs, in a file any tool reads (pandas, a spreadsheet, `column -s, -t`).

Lightning's CSVLogger writes into a folder of its own and deletes an existing metrics.csv when that folder holds
other files, which a run directory always does: a resumed run would lose its history. Here the file is one entry
of the run directory (recurlen.training.run_dir owns the name) and a resume continues it: the rows an interrupted
run logged after the checkpoint it resumes from are replaced by the steps it trains again, the earlier rows kept
(ContinueMetricsFile tells the file that step once the checkpoint is restored).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning as L
from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import CSVLogger

from recurlen.training.run_dir import RunDir
from recurlen.util.atomic_files import write_text

STEP = "step"


def read_metrics(path: str | Path) -> list[dict[str, float]]:
    """The rows of a metrics.csv (step as an int, every other cell a float; empty cells left out). Rows whose step
    cannot be read (a file cut short) are skipped."""
    path = Path(path)
    if not path.is_file():
        return []
    rows = []
    with path.open(newline="") as f:
        for raw in csv.DictReader(f):
            try:
                step = int(float(raw.get(STEP) or "nan"))
            except (ValueError, OverflowError):
                continue
            row: dict[str, float] = {STEP: step}
            for key, value in raw.items():
                if key and key != STEP and value not in (None, ""):
                    row[key] = float(value)
            rows.append(row)
    return rows


class MetricsFile:
    """What the CSV logger writes to: the rows of this process, rewritten into metrics.csv (atomically) on save.

    One row per logging call. Lightning hands a step's metrics over twice when that step writes a checkpoint
    (recurlen logs them before it, Lightning again after the step): a value repeated at the same step is dropped,
    as the TensorBoard logger does."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.metrics: list[dict[str, float]] = []  # logged, not yet saved (Lightning's writer's name for them)
        self._rows: list[dict[str, float]] | None = None  # the file's rows, read at the first save
        self._last: tuple[int | None, dict[str, float]] = (None, {})
        self._resumed_at: int | None = None

    def continue_from(self, global_step: int) -> None:
        """The run trains on from this optimizer step: the file's rows of later steps were logged by a run that
        stopped before its next checkpoint, and are dropped. (Lightning logs the step that brings the count to n
        as step n - 1, so rows with step >= global_step are the ones trained again.)"""
        self._resumed_at = global_step

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        values = {k: float(v.item() if hasattr(v, "item") else v) for k, v in metrics.items() if k != "epoch"}
        last_step, written = self._last
        if step is None or step != last_step:
            written = {}
        fresh = {k: v for k, v in values.items() if k not in written or not _same(written[k], v)}
        self._last = (step, {**written, **fresh})
        if fresh:
            self.metrics.append({STEP: len(self.metrics) if step is None else int(step), **fresh})

    def log_hparams(self, params: Mapping[str, Any]) -> None:
        """Nothing: the run's settings are its config.yaml."""

    def save(self) -> None:
        if not self.metrics:
            return
        if self._rows is None:
            below = self._resumed_at if self._resumed_at is not None else min(int(r[STEP]) for r in self.metrics)
            self._rows = [row for row in read_metrics(self.path) if row[STEP] < below]
            # A validation the checkpoint was saved before is run again on resume: a value already in the file
            # at that step is not written twice.
            kept = {(row[STEP], k): v for row in self._rows for k, v in row.items() if k != STEP}
            fresh = [{k: v for k, v in row.items() if k == STEP or not _same(kept.get((row[STEP], k)), v)}
                     for row in self.metrics]
            self.metrics = [row for row in fresh if len(row) > 1]
        self._rows += self.metrics
        self.metrics = []
        keys = sorted({key for row in self._rows for key in row} - {STEP})
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=[STEP, *keys], lineterminator="\n")
        writer.writeheader()
        writer.writerows(self._rows)
        write_text(self.path, text.getvalue())


def _same(a: float | None, b: float) -> bool:
    return a is not None and (a == b or (math.isnan(a) and math.isnan(b)))


class ContinueMetricsFile(Callback):
    """Tells the run's metrics.csv the step training goes on from, once Lightning has restored the checkpoint."""

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for logger in trainer.loggers:
            if isinstance(logger, RunCSVLogger) and isinstance(logger.experiment, MetricsFile):
                logger.experiment.continue_from(trainer.global_step)


class RunCSVLogger(CSVLogger):
    """Lightning's CSV logger writing the run directory's metrics.csv (rank zero only, as every Lightning logger)."""

    def __init__(self, run: RunDir) -> None:
        super().__init__(save_dir=str(run.path), name="", version="")
        self._file = run.metrics_file

    @property
    @rank_zero_experiment
    def experiment(self) -> MetricsFile:  # type: ignore[override]
        if self._experiment is None:
            self._experiment = MetricsFile(self._file)
        return self._experiment


__all__ = ["ContinueMetricsFile", "MetricsFile", "RunCSVLogger", "read_metrics"]
