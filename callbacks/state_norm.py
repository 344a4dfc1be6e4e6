"""Norm and standard deviation of the recurrent state by position, during validation.

Runs the held-out sequences from the zero state (no LM head) and samples the state at every
chunk end, at every multiple of T and at log-spaced early positions. Logs, per layer and at
positions T, 2T, 4T, ... <= L: `{prefix}/state_norm/layer{i}@{k}T`, `{prefix}/state_std/layer{i}@{k}T`
and the layer means `{prefix}/state_norm/mean@{k}T`, `{prefix}/state_std/mean@{k}T`; the figure
`{prefix}/figures/state` has the whole curves (SSM and conv state).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import lightning.pytorch as pl
import torch

from callbacks._common import (
    DiagnosticCallback,
    log_figures,
    rank_share,
    synced_sums,
)
from recurlen.eval.plots import plot_state
from recurlen.eval.positionwise import evaluate_positionwise, evaluation_ends
from recurlen.eval.state_stats import STATE_STATS, StateCurves


class StateNormMonitor(DiagnosticCallback):
    """State statistics by position, averaged over held-out sequences and ranks."""

    def __init__(self, *, seq_len: int | None = None, num_sequences: int | None = None, train_len: int | None = None,
                 state_points: int = 32, layers: Sequence[int] | None = None, chunk_len: int | None = None,
                 batch_size: int = 4, sequences: torch.Tensor | None = None, bf16: bool = False,
                 every_n_val_epochs: int = 1, log_figures: bool = True, prefix: str = "val") -> None:
        """layers: which layers get scalars (default all; the figure always has all of them)."""
        super().__init__(num_sequences=num_sequences, train_len=train_len, chunk_len=chunk_len, batch_size=batch_size,
                         sequences=sequences, bf16=bf16, every_n_val_epochs=every_n_val_epochs,
                         log_figures=log_figures, prefix=prefix)
        if state_points < 0:
            raise ValueError(f"state_points must be >= 0; got {state_points}")
        self.seq_len = seq_len
        self.state_points = state_points
        self.layers = None if layers is None else [int(i) for i in layers]

    def layout(self) -> tuple[str, dict[str, list[str]]]:
        p = re.escape(self.prefix)
        return "recurlen: recurrent state", {"SSM state norm (per layer, at kT)": [rf"^{p}/state_norm/"],
                                             "SSM state std (per layer, at kT)": [rf"^{p}/state_std/"]}

    def evaluate(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        model, train_len, chunk_len = self.model_and_lengths(pl_module)
        seqs_NL = self.held_out(trainer, self.seq_len, train_len)
        seq_len = seqs_NL.shape[1]
        n_layer = model.zero_state(1).n_layer
        bad = [i for i in (self.layers or []) if not 0 <= i < n_layer]
        if bad:
            raise ValueError(f"StateNormMonitor: layers {bad} do not exist; the model has {n_layer} layers")
        positions = evaluation_ends(seq_len, train_len=train_len, chunk_len=chunk_len,
                                    state_points=self.state_points)
        curves = StateCurves.empty(positions, n_layer)
        share_NL = rank_share(seqs_NL, trainer)
        if share_NL.shape[0]:
            res = evaluate_positionwise(model, share_NL, train_len=train_len, chunk_len=chunk_len,
                                        batch_size=self.batch_size, reset_control=False, state_stats=True,
                                        state_points=self.state_points, with_nll=False, bf16=self.bf16)
            assert res.state.positions == positions, "state positions must agree across ranks"
            curves = res.state
        totals = synced_sums(pl_module, {"sums": curves.sums_FKS,
                                         "count": torch.tensor(float(curves.count), dtype=torch.float64)})
        curves = StateCurves(positions, totals["sums"], int(totals["count"]))
        means = curves.means()
        scalars = {}
        multiple = 1
        while multiple * train_len <= seq_len:
            at = "T" if multiple == 1 else f"{multiple}T"
            index = positions.index(multiple * train_len)
            for stat, name in (("ssm_norm", "state_norm"), ("ssm_std", "state_std")):
                curve_KS = means[stat]
                for i in self.layers if self.layers is not None else range(n_layer):
                    scalars[f"{self.prefix}/{name}/layer{i}@{at}"] = float(curve_KS[i, index])
                scalars[f"{self.prefix}/{name}/mean@{at}"] = float(curve_KS[:, index].mean())
            multiple *= 2
        self.log_scalars(pl_module, scalars)
        self.last_results = {"label": f"step {trainer.global_step}", "train_len": train_len, "seq_len": seq_len,
                             "state": curves.to_dict()}
        if self.log_figures:
            log_figures(trainer, {f"{self.prefix}/figures/state": plot_state([self.last_results], stats=STATE_STATS)})
