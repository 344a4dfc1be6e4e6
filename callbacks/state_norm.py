"""Norm and standard deviation of the recurrent state by position, during validation.

Runs the held-out sequences from the zero state (no LM head) and samples the state at every
chunk end, at every multiple of T and at log-spaced early positions. Logs, at positions T, 2T, 4T, ... <= L
(zero-padded so that tags sort in position order: `@01T`, `@02T`, ... `@32T`), the means over layers
`{prefix}/state_norm/mean@{k}T`, `{prefix}/state_std/mean@{k}T`, and for the chosen `layers` (default
none) `{prefix}/state_norm/layer{i}@{k}T`, `{prefix}/state_std/layer{i}@{k}T`; the figure
`{prefix}/figures/state` has the whole curves of every layer (SSM and conv state).
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

from recurlen.diagnostics.plots import plot_state
from recurlen.diagnostics.positionwise import evaluate_positionwise, evaluation_ends
from recurlen.diagnostics.state_stats import STATE_STATS, StateCurves
from recurlen.util.tensorboard import bin_width


class StateNormMonitor(DiagnosticCallback):
    """State statistics by position, averaged over held-out sequences and ranks."""

    title = "state norm"

    def __init__(self, *, seq_len: int | None = None, num_sequences: int | None = None, train_len: int | None = None,
                 state_points: int = 32, layers: Sequence[int] | None = None, chunk_len: int | None = None,
                 batch_size: int = 4, sequences: torch.Tensor | None = None, bf16: bool = False,
                 every_n_val_epochs: int = 1, log_figures: bool = True, prefix: str = "val") -> None:
        """layers: layers that get scalars of their own besides the mean over layers (default none; the figure
        always has all of them)."""
        super().__init__(num_sequences=num_sequences, train_len=train_len, chunk_len=chunk_len, batch_size=batch_size,
                         sequences=sequences, bf16=bf16, every_n_val_epochs=every_n_val_epochs,
                         log_figures=log_figures, prefix=prefix)
        if state_points < 0:
            raise ValueError(f"state_points must be >= 0; got {state_points}")
        self.seq_len = seq_len
        self.state_points = state_points
        self.layers = [] if layers is None else [int(i) for i in layers]

    def layout(self) -> tuple[str, dict[str, list[str]]]:
        p = re.escape(self.prefix)
        return "recurlen: recurrent state", {"SSM state norm at kT (mean over layers)": [rf"^{p}/state_norm/mean@"],
                                             "SSM state std at kT (mean over layers)": [rf"^{p}/state_std/mean@"],
                                             **({"SSM state norm at kT, chosen layers": [rf"^{p}/state_norm/layer"]}
                                                if self.layers else {})}

    def evaluate(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        model, train_len, chunk_len = self.model_and_lengths(pl_module)
        seqs_NL = self.held_out(trainer, self.seq_len, train_len)
        seq_len = seqs_NL.shape[1]
        n_layer = model.zero_state(1).n_layer
        bad = [i for i in self.layers if not 0 <= i < n_layer]
        if bad:
            raise ValueError(f"StateNormMonitor: layers {bad} do not exist; the model has {n_layer} layers")
        positions = evaluation_ends(seq_len, train_len=train_len, chunk_len=chunk_len,
                                    state_points=self.state_points)
        curves = StateCurves.empty(positions, n_layer)
        share_NL = rank_share(seqs_NL, trainer)
        if share_NL.shape[0]:
            res = evaluate_positionwise(model, share_NL, train_len=train_len, chunk_len=chunk_len,
                                        batch_size=self.batch_size, reset_control=False, state_stats=True,
                                        state_points=self.state_points, with_nll=False, bf16=self.bf16,
                                        progress=self.show_progress(trainer, share_NL.shape[0]))
            assert res.state.positions == positions, "state positions must agree across ranks"
            curves = res.state
        totals = synced_sums(pl_module, {"sums": curves.sums_FKS,
                                         "count": torch.tensor(float(curves.count), dtype=torch.float64)})
        curves = StateCurves(positions, totals["sums"], int(totals["count"]))
        means = curves.means()
        scalars = {}
        multiple = 1
        width = bin_width(seq_len // train_len)
        while multiple * train_len <= seq_len:
            at = f"{multiple:0{width}d}T"
            index = positions.index(multiple * train_len)
            for stat, name in (("ssm_norm", "state_norm"), ("ssm_std", "state_std")):
                curve_KS = means[stat]
                for i in self.layers:
                    scalars[f"{self.prefix}/{name}/layer{i}@{at}"] = float(curve_KS[i, index])
                scalars[f"{self.prefix}/{name}/mean@{at}"] = float(curve_KS[:, index].mean())
            multiple *= 2
        self.log_scalars(pl_module, scalars)
        self.last_results = {"label": f"step {trainer.global_step}", "train_len": train_len, "seq_len": seq_len,
                             "state": curves.to_dict()}
        if self.log_figures:
            log_figures(trainer, {f"{self.prefix}/figures/state": plot_state([self.last_results], stats=STATE_STATS)})
