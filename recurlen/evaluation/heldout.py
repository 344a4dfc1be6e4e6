"""The held-out long sequences an evaluation runs on, and the evaluation of checkpoints on them.

The sequences come from the first run's own data config (its validation split), else from a data group
of experiments/data/ (`data=pg19`), with `data.key=value` overrides on top.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from omegaconf import OmegaConf

from recurlen.evaluation.runner import EvalConfig, run_eval
from recurlen.training.data.config import DataConfig

log = logging.getLogger(__name__)


def run_data_config(path: str) -> DataConfig | None:
    """The DataConfig a recurlen run trained with (from its config.yaml), or None."""
    from recurlen.training.run_dir import run_config

    data = (run_config(path) or {}).get("data")
    return None if not data else OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(DataConfig), data))


def build_data_config(first_checkpoint: str, data_group: str | None, data_overrides: list[str]) -> DataConfig:
    """The held-out data: the run's own, else `data_group` (default embedded); `data.key=value` on top."""
    from recurlen.training.experiments.compose import available, experiments_dir
    from recurlen.util.arguments import suggest

    cfg = None if data_group else run_data_config(first_checkpoint)
    if cfg is None:
        group = data_group or "embedded"
        path = experiments_dir() / "data" / f"{group}.yaml"
        if not path.is_file():
            choices = available("data")
            raise ValueError(f"unknown data {group!r}{suggest(group, choices)}; allowed: {choices}")
        merged = OmegaConf.merge(OmegaConf.structured(DataConfig), OmegaConf.load(path))
    else:
        merged = OmegaConf.structured(cfg)
    if data_overrides:
        merged = OmegaConf.merge(merged, OmegaConf.from_dotlist([d[len("data."):] for d in data_overrides]))
    return OmegaConf.to_object(merged)


def evaluate_checkpoints(cfg: EvalConfig, data: DataConfig) -> Path:
    """Evaluate cfg.checkpoints on `cfg.num_sequences` held-out sequences of `data`; returns results.json."""
    from recurlen.training.data.datamodule import RecurlenDataModule

    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    dm = RecurlenDataModule(data)
    dm.setup("validate")
    if cfg.seq_len is None:
        cfg.seq_len = data.long_val_length
    sequences = dm.long_validation_sequences(length=cfg.seq_len, num=cfg.num_sequences)
    run_eval(cfg, sequences)
    return Path(cfg.output_dir) / "results.json"


__all__ = ["build_data_config", "evaluate_checkpoints", "run_data_config"]
