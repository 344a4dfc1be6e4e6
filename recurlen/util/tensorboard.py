"""TensorBoard as a table and charts that compare runs.

- `RunTensorBoardLogger`: Lightning's TensorBoard logger without the `epoch` scalar it adds to every log
  call (one endless epoch here: a flat line that means nothing).
- `write_hparams`: the HParams tab's row of a run: its settings (model, intervention, lr, steps, T, ...)
  and the scalar tags shown as metric columns (their latest values), so the tab is the table of runs.
- `sortable_bin`: position-bin names whose tags sort in position order in TensorBoard (`[T,2T)` ->
  `[01T,02T)`, `[0,T)` -> `[00,01T)`): TensorBoard sorts tags as text, where `[T,2T)` came after `[16T,32T)`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping

from lightning.pytorch.loggers import TensorBoardLogger


class RunTensorBoardLogger(TensorBoardLogger):
    """TensorBoardLogger that drops Lightning's per-call `epoch` scalar."""

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        super().log_metrics({k: v for k, v in metrics.items() if k != "epoch"}, step)


def sortable_bin(name: str, width: int) -> str:
    """'[T,2T)' -> '[01T,02T)' (width 2): a bare T becomes 1T and every number is zero-padded."""
    name = re.sub(r"(?<![\dT])T", "1T", name)
    return re.sub(r"\d+", lambda m: m.group().zfill(width), name)


def bin_width(max_value: int) -> int:
    return len(str(max(int(max_value), 1)))


def fraction_tag(t: int, context_len: int) -> str:
    """t as a fraction of T with fixed decimals ('0.250T'), so tags sort in order and mean the same at any T."""
    return f"{t / context_len:.3f}T"


def write_hparams(writer, hparams: Mapping[str, object], metric_tags: Iterable[str]) -> None:
    """The run's HParams row: `hparams` (str / number / bool values) with `metric_tags` as metric columns."""
    from torch.utils.tensorboard.summary import hparams as hparams_summary

    clean = {k: (v if isinstance(v, (bool, int, float, str)) and not (isinstance(v, float) and math.isnan(v))
                 else str(v)) for k, v in hparams.items()}
    exp, ssi, sei = hparams_summary(clean, {tag: 0.0 for tag in metric_tags})  # values unused: tags only
    file_writer = writer._get_file_writer()
    for summary in (exp, ssi, sei):
        file_writer.add_summary(summary)
    writer.flush()


__all__ = ["RunTensorBoardLogger", "bin_width", "fraction_tag", "sortable_bin", "write_hparams"]
