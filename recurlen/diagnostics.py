"""Map the experiment's `diagnostics` section onto the validation callbacks (top-level `callbacks/` package)."""

from __future__ import annotations

from lightning.pytorch.callbacks import Callback

from recurlen.experiment.schema import ExperimentConfig


def build_callbacks(cfg: ExperimentConfig) -> list[Callback]:
    from callbacks import EffectiveRemembrance, PositionwisePerplexity, StateNormMonitor

    d = cfg.diagnostics
    if cfg.task.name or cfg.data.val_sequences == 0:
        return []  # task data has no long held-out documents; the task's own evaluation measures it
    T = cfg.data.seq_len
    common = dict(num_sequences=d.num_sequences, chunk_len=d.chunk_len, every_n_val_epochs=d.every_n_val)
    out: list[Callback] = []
    if d.positionwise:
        out.append(PositionwisePerplexity(bins=d.bins, **common))
    if d.state_norm:
        out.append(StateNormMonitor(**common))
    if d.effrem:
        out.append(EffectiveRemembrance(context_len=d.effrem_T_factor * T, num_points=d.effrem_points, **common))
    return out
