"""The run's loggers: TensorBoard (tb/) and metrics.csv always; W&B and MLflow when trainer.loggers names them.

This module imports nothing heavy at the top: the schema checks names against OPTIONAL_LOGGERS, and the preflight
checks that each chosen package is installed before anything is built or written. Both optional loggers stay off
the network unless the user's environment says otherwise: W&B runs offline (its files in the run directory's
wandb/, for a later `wandb sync`) unless WANDB_MODE is set; MLflow writes a local store in the run directory's
mlruns/ unless MLFLOW_TRACKING_URI names a server.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from recurlen.training.run_dir import MLFLOW_DIR, TENSORBOARD_DIR, WANDB_DIR, RunDir
from recurlen.util.errors import UserError

OPTIONAL_LOGGERS = {"wandb": "wandb", "mlflow": "mlflow"}
"""trainer.loggers' choices -> the package each needs (not a dependency of recurlen: install it to use it)."""


def check_logger_names(names: list[str]) -> None:
    """The settings rule (ExperimentConfig): known names, each once."""
    for name in names:
        if name not in OPTIONAL_LOGGERS:
            always = " (TensorBoard and metrics.csv are always written)" if name in ("tensorboard", "csv") else ""
            raise ValueError(f"trainer.loggers has {name!r}{always}; allowed: {list(OPTIONAL_LOGGERS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"trainer.loggers names a logger twice: {list(names)}")


def check_installed(names: list[str]) -> None:
    """Each chosen logger's package imports here; the missing ones are one line naming every one of them (before
    anything is written)."""
    missing = {}
    for name in names:
        try:
            importlib.import_module(OPTIONAL_LOGGERS[name])
        except ImportError:
            missing[name] = OPTIONAL_LOGGERS[name]
    if len(missing) == 1:
        (name, package), = missing.items()
        raise UserError(f"trainer.loggers=[{name}] needs the {package} package, which is not installed here: "
                        f"pip install {package} (or leave {name} out of trainer.loggers)")
    if missing:
        listed = ",".join(missing)
        raise UserError(f"trainer.loggers=[{listed}] needs the packages {' and '.join(missing.values())}, which are "
                        f"not installed here: pip install {' '.join(missing.values())} (or leave them out of "
                        "trainer.loggers)")


def describe(names: list[str], run: RunDir) -> str:
    """The preflight's line: where each logger writes."""
    where = [f"TensorBoard {run.path / TENSORBOARD_DIR}", f"CSV {run.metrics_file}"]
    if "wandb" in names:
        where.append(f"W&B {os.environ['WANDB_MODE']} (WANDB_MODE)" if os.environ.get("WANDB_MODE")
                     else f"W&B offline in {run.path / WANDB_DIR}")
    if "mlflow" in names:
        where.append(f"MLflow {os.environ['MLFLOW_TRACKING_URI']}" if os.environ.get("MLFLOW_TRACKING_URI")
                     else f"MLflow local store {run.path / MLFLOW_DIR}")
    return ", ".join(where)


def build_loggers(names: list[str], run: RunDir, *, experiment: str) -> list[Any]:
    """TensorBoard first (trainer.logger, what the callbacks' figures go to), then metrics.csv, then the chosen."""
    from recurlen.training.csv_logger import RunCSVLogger
    from recurlen.util.tensorboard import RunTensorBoardLogger

    check_installed(names)
    loggers: list[Any] = [
        RunTensorBoardLogger(save_dir=str(run.path), name=TENSORBOARD_DIR, version="", default_hp_metric=False),
        RunCSVLogger(run),
    ]
    label = run.path.as_posix()
    if "wandb" in names:
        from lightning.pytorch.loggers import WandbLogger

        project = os.environ.get("WANDB_PROJECT") or experiment or "recurlen"
        loggers.append(WandbLogger(name=label, save_dir=str(run.path), project=project,
                                   offline=not os.environ.get("WANDB_MODE")))
    if "mlflow" in names:
        from lightning.pytorch.loggers import MLFlowLogger

        if not os.environ.get("MLFLOW_TRACKING_URI"):
            # MLflow 3 refuses its file store unless told it is wanted: a folder of the run directory is the store
            # that needs no server and no database package (`mlflow ui --backend-store-uri RUN/mlruns` shows it).
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        loggers.append(MLFlowLogger(experiment_name=experiment or "recurlen", run_name=label,
                                    tracking_uri=os.environ.get("MLFLOW_TRACKING_URI") or None,
                                    save_dir=str((run.path / MLFLOW_DIR).resolve())))
    return loggers


__all__ = ["OPTIONAL_LOGGERS", "build_loggers", "check_installed", "check_logger_names", "describe"]
