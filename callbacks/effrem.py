"""Effective Remembrance EffRem_T(t) during validation (see recurlen.diagnostics.effrem).

Logs `{prefix}/effrem@t={t/T:.3f}T` for every t > 0 of the grid, t as a fraction of T (T defaults to 4x the
training context, the grid to evenly spaced values in [0, T-1]), and the figure `{prefix}/figures/effrem`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import lightning.pytorch as pl
import torch
from recurlen.callbacks.diagnostic import (
    DiagnosticCallback,
    log_figures,
    rank_share,
    synced_sums,
)

from recurlen.diagnostics.effrem import EffRemResult, check_t_grid, default_t_grid, effective_remembrance
from recurlen.diagnostics.plots import plot_effrem
from recurlen.util.tensorboard import fraction_tag


class EffectiveRemembrance(DiagnosticCallback):
    """EffRem_T(t) averaged over held-out sequences and ranks."""

    title = "EffRem"

    def __init__(self, *, context_len: int | None = None, t_grid: Sequence[int] | None = None, num_points: int = 9,
                 num_sequences: int | None = None, train_len: int | None = None, chunk_len: int | None = None,
                 batch_size: int = 4, max_batch_rows: int = 64, sequences: torch.Tensor | None = None,
                 bf16: bool = False, every_n_val_epochs: int = 1, log_figures: bool = True,
                 prefix: str = "val") -> None:
        """context_len: T of EffRem_T (default 4 x train_len); t_grid: values in [0, T-1]."""
        super().__init__(num_sequences=num_sequences, train_len=train_len, chunk_len=chunk_len, batch_size=batch_size,
                         sequences=sequences, bf16=bf16, every_n_val_epochs=every_n_val_epochs,
                         log_figures=log_figures, prefix=prefix)
        if context_len is not None and t_grid is not None:
            check_t_grid(t_grid, context_len)  # fail at construction, not after the first epoch
        self.context_len = context_len
        self.t_grid = None if t_grid is None else [int(t) for t in t_grid]
        self.num_points = num_points
        self.max_batch_rows = max_batch_rows
        self.tags: list[str] = []

    def hparam_metrics(self) -> list[str]:
        return list(self.tags)

    def layout(self) -> tuple[str, dict[str, list[str]]]:
        p = re.escape(self.prefix)
        return "recurlen: effective remembrance", {"EffRem_T(t) (lower: forgets the distant past)": [rf"^{p}/effrem@"]}

    def evaluate(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        model, train_len, chunk_len = self.model_and_lengths(pl_module)
        context_len = self.context_len or 4 * train_len
        if context_len <= train_len:
            raise ValueError(f"EffectiveRemembrance: T={context_len} must be larger than the training context "
                             f"train_len={train_len}")
        grid = check_t_grid(self.t_grid, context_len) if self.t_grid is not None else \
            default_t_grid(context_len, self.num_points)
        seqs_NT = self.held_out(trainer, context_len, train_len, what="T")
        result = EffRemResult(context_len, grid, torch.zeros(len(grid), dtype=torch.float64), 0)
        share_NT = rank_share(seqs_NT, trainer)
        if share_NT.shape[0]:
            result = effective_remembrance(model, share_NT, context_len=context_len, t_grid=grid,
                                           train_len=train_len, chunk_len=chunk_len, batch_size=self.batch_size,
                                           max_batch_rows=self.max_batch_rows, bf16=self.bf16,
                                           progress=self.show_progress(trainer, share_NT.shape[0]))
        totals = synced_sums(pl_module, {"tv": result.tv_sum_G,
                                         "count": torch.tensor(float(result.count), dtype=torch.float64)})
        result = EffRemResult(context_len, grid, totals["tv"], int(totals["count"]))
        mean_G = result.mean()
        # t as a fraction of EffRem's T (the same tag at any T); t = 0 is TV(q, q) = 0 by definition.
        scalars = {f"{self.prefix}/effrem@t={fraction_tag(t, context_len)}": float(v)
                   for t, v in zip(grid, mean_G) if t > 0}
        self.log_scalars(pl_module, scalars)
        self.tags = list(scalars)
        self.last_results = {"label": f"step {trainer.global_step}", "train_len": train_len,
                             "effrem": result.to_dict()}
        if self.log_figures:
            log_figures(trainer, {f"{self.prefix}/figures/effrem": plot_effrem([self.last_results])})
