"""TensorBoard as a table and charts that compare runs.

- `RunTensorBoardLogger`: Lightning's TensorBoard logger without the `epoch` scalar it adds to every log
  call (one endless epoch here: a flat line that means nothing), writing a step's metrics once.
- `write_hparams`: the HParams tab's row of a run: its settings (model, intervention, lr, steps, T, ...)
  and the scalar tags shown as metric columns (their latest values), so the tab is the table of runs. The row
  lives in an event file of its own, replaced by each process of the run (`read_hparams` reads it back).
- `write_event_dir`: scalars, figures, text and a custom-scalars layout written once into an event directory
  that TensorBoard shows as a run of its own (a comparison of runs, a task's accuracies by length).
- `sortable_bin`: position-bin names whose tags sort in position order in TensorBoard (`[T,2T)` ->
  `[01T,02T)`, `[0,T)` -> `[00,01T)`): TensorBoard sorts tags as text, where `[T,2T)` came after `[16T,32T)`;
  `plain_bin` turns them back into the names people read.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import TensorBoardLogger


class RunTensorBoardLogger(TensorBoardLogger):
    """TensorBoardLogger that drops Lightning's per-call `epoch` scalar and writes a step's metrics once.

    A step that writes a checkpoint logs its metrics before the checkpoint (so that a process killed while writing
    it leaves no checkpoint whose step was never logged); Lightning then hands the same metrics over again after
    the step: the values that second call repeats (same tag, step and value) are dropped."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._last_logged: tuple[int | None, dict[str, float]] | None = None

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        metrics = {k: v for k, v in metrics.items() if k != "epoch"}
        last_step, written = self._last_logged or (None, {})
        if step is None or step != last_step:
            written = {}
        fresh = {k: v for k, v in metrics.items() if k not in written or written[k] != float(v)}
        self._last_logged = (step, {**written, **{k: float(v) for k, v in fresh.items()}})
        if fresh:
            super().log_metrics(fresh, step)


def sortable_bin(name: str, width: int) -> str:
    """'[T,2T)' -> '[01T,02T)' (width 2): a bare T becomes 1T and every number is zero-padded."""
    name = re.sub(r"(?<![\dT])T", "1T", name)
    return re.sub(r"\d+", lambda m: m.group().zfill(width), name)


def bin_width(max_value: int) -> int:
    return len(str(max(int(max_value), 1)))


def fraction_tag(t: int, context_len: int) -> str:
    """t as a fraction of T with fixed decimals ('0.250T'), so tags sort in order and mean the same at any T."""
    return f"{t / context_len:.3f}T"


def plain_bin(name: str) -> str:
    """The inverse of `sortable_bin` for bins in units of T: '[04T,08T)' -> '[4T,8T)', '[00,01T)' -> '[0,T)'."""
    name = re.sub(r"\d+", lambda m: str(int(m.group())), name)
    return re.sub(r"(?<![\d.])1T", "T", name)


HPARAMS_SUFFIX = ".hparams"
"""Suffix of the event file that holds a run's HParams row (and nothing else)."""


def _hparams_files(log_dir: Path) -> list[Path]:
    return sorted(log_dir.glob(f"events.out.tfevents.*{HPARAMS_SUFFIX}"))


def write_hparams(log_dir: str | os.PathLike, hparams: Mapping[str, object],
                  metrics: Mapping[str, str] | Iterable[str]) -> Path:
    """The run's HParams row: `hparams` (str / number / bool values) with `metrics` as metric columns, in order.

    metrics: scalar tags, or {tag: column heading} (TensorBoard's display name; the tag stays the one the scalar
    is logged under). The row goes into an event file of its own in log_dir, and the one an earlier process of
    the run wrote is deleted once the new one is on disk: TensorBoard keeps the first hparams summary it reads
    in a run, so a row appended to the main event file after a resume (new max_steps, lr, ...) would never show.
    Returns the new file."""
    from tensorboard.plugins.hparams import plugin_data_pb2
    from torch.utils.tensorboard.summary import hparams as hparams_summary
    from torch.utils.tensorboard.writer import FileWriter

    headings = dict(metrics) if isinstance(metrics, Mapping) else {tag: tag for tag in metrics}
    clean = {k: (v if isinstance(v, (bool, int, float, str)) and not (isinstance(v, float) and math.isnan(v))
                 else str(v)) for k, v in hparams.items()}
    exp, ssi, sei = hparams_summary(clean, {tag: 0.0 for tag in headings})  # values unused: tags only
    value = exp.value[0]
    data = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
    for info in data.experiment.metric_infos:
        if headings[info.name.tag] != info.name.tag:
            info.display_name = headings[info.name.tag]
    value.metadata.plugin_data.content = data.SerializeToString()
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    before = _hparams_files(log_dir)
    writer = FileWriter(str(log_dir), filename_suffix=HPARAMS_SUFFIX)
    try:
        for summary in (exp, ssi, sei):
            writer.add_summary(summary)
    finally:
        writer.close()
    new = [p for p in _hparams_files(log_dir) if p not in before]
    for old in before:
        old.unlink(missing_ok=True)
    return new[-1]


def read_hparams(log_dir: str | os.PathLike) -> tuple[dict[str, object], dict[str, str]] | None:
    """(hparams, {metric tag: column heading}) of the run's HParams row in log_dir; None if it has none."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.plugins.hparams import metadata, plugin_data_pb2

    files = _hparams_files(Path(log_dir))
    if not files:
        return None
    hparams: dict[str, object] = {}
    metrics: dict[str, str] = {}
    for event in EventFileLoader(str(files[-1])).Load():
        for value in event.summary.value:
            data = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
            if value.tag == metadata.EXPERIMENT_TAG:
                metrics = {m.name.tag: m.display_name or m.name.tag for m in data.experiment.metric_infos}
            elif value.tag == metadata.SESSION_START_INFO_TAG:
                for name, v in data.session_start_info.hparams.items():
                    hparams[name] = getattr(v, v.WhichOneof("kind"))
    return hparams, metrics


def write_event_dir(directory: str | os.PathLike, *, scalars: Mapping[str, Sequence[tuple[int, float]]] = {},
                    figures: Mapping[str, Any] = {}, texts: Mapping[str, str] = {},
                    layout: Mapping[str, Mapping[str, Sequence[str]]] | None = None) -> Path:
    """Write scalars ((step, value) series), matplotlib figures, Markdown texts and a custom-scalars layout
    ({category: {chart title: [tag regexes]}}) into `directory`, which TensorBoard shows as a run of its own.

    The directory's earlier event files are deleted first: it holds one result written whole (a comparison, a
    task's evaluation), and a rerun must not show two versions of it side by side."""
    from torch.utils.tensorboard import SummaryWriter

    directory = Path(directory)
    for old in directory.glob("events.out.tfevents.*"):
        old.unlink()
    writer = SummaryWriter(log_dir=str(directory))
    try:
        for tag, series in scalars.items():
            for step, value in series:
                writer.add_scalar(tag, value, global_step=int(step))
        for tag, fig in figures.items():
            # close=False: closing goes through pyplot, which recurlen's pyplot-free figures never touch.
            writer.add_figure(tag, fig, global_step=0, close=False)
        for tag, text in texts.items():
            writer.add_text(tag, text, global_step=0)
        if layout:
            writer.add_custom_scalars({category: {title: ["Multiline", list(tags)] for title, tags in charts.items()}
                                       for category, charts in layout.items()})
    finally:
        writer.close()
    return directory


__all__ = ["HPARAMS_SUFFIX", "RunTensorBoardLogger", "bin_width", "fraction_tag", "plain_bin", "read_hparams",
           "sortable_bin", "write_event_dir", "write_hparams"]
