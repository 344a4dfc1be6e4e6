"""The held-out long sequences an evaluation runs on, and the evaluation of checkpoints on them.

The sequences come from the first run's own data config (its validation split; an export's, the run's it was made
from, as its recurlen_export.json records it), else from a data group
of experiments/data/ (`data=pg19`), with `data.key=value` overrides on top.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import torch
from omegaconf import OmegaConf

from recurlen.evaluation.runner import EvalConfig, run_eval
from recurlen.training.data.config import DataConfig
from recurlen.util.errors import UserError

log = logging.getLogger(__name__)


def run_data_config(path: str) -> DataConfig | None:
    """The DataConfig a recurlen run trained with (from its config.yaml), or that of the run an export was made from
    (its recurlen_export.json), or None."""
    from recurlen.models.export_manifest import recorded_data
    from recurlen.training.run_dir import run_config

    data = (run_config(path) or {}).get("data")
    if not data and Path(path).expanduser().is_dir():
        known = {f.name for f in dataclasses.fields(DataConfig)}  # a later recurlen's settings: left to it
        data = {k: v for k, v in (recorded_data(Path(path).expanduser()) or {}).items() if k in known}
        if data:
            log.info("held-out data: the settings of the run %s was exported from (its recurlen_export.json)", path)
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
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    if cfg.seq_len is None:
        cfg.seq_len = data.long_val_length
    num = cfg.scored_rows() + cfg.calibration_rows()  # the fixes calibrate on the rows after the scored ones
    run_eval(cfg, heldout_sequences(data, length=cfg.seq_len, num=num))
    return Path(cfg.output_dir) / "results.json"


def heldout_sequences(data: DataConfig, *, length: int, num: int) -> torch.Tensor:
    """(num, length) held-out tokens of `data`, chosen by the evaluation's own length and count (not by the
    validation settings of the run that trained on `data`); too little held-out data is a one-line UserError."""
    from recurlen.training.data.datamodule import RecurlenDataModule

    data = dataclasses.replace(data, val_length=length, val_sequences=num, val_segments=0)
    try:
        dm = RecurlenDataModule(data)
        dm.setup("validate")
        return dm.long_validation_sequences(length=length, num=num)
    except (ValueError, FileNotFoundError) as err:
        why = str(err).split("; ")[0]  # the fact; the data's own advice names its validation settings, not these
        raise UserError(f"the held-out data cannot give {num} sequence(s) of seq_len={length} tokens: {why}; lower "
                        "seq_len or num_sequences, raise data.val_fraction, set data.val_mode=pack or windows, or "
                        "choose other data (data=GROUP, data.source=...)") from err


__all__ = ["build_data_config", "evaluate_checkpoints", "heldout_sequences", "run_data_config"]
