"""Map the experiment's `diagnostics` section onto the validation callbacks."""

from __future__ import annotations

from lightning.pytorch.callbacks import Callback

from recurlen.experiment.schema import ExperimentConfig


def build_callbacks(cfg: ExperimentConfig) -> list[Callback]:
    return []
