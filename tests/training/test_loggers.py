"""The run's loggers: metrics.csv in every run directory (continued by a resume), W&B / MLflow chosen by
trainer.loggers, a missing package one line before anything is written."""

import csv
import sys

import pytest

from recurlen.commands.cli import main
from recurlen.training.csv_logger import MetricsFile, read_metrics
from recurlen.training.experiments.compose import load_experiment
from recurlen.training.finetune import run_finetune
from recurlen.training.run_dir import METRICS_FILE, RunDir


def _header(path):
    with open(path, newline="") as f:
        return next(csv.reader(f))


def test_a_tiny_run_writes_metrics_csv_and_a_resume_continues_it(tmp_path, experiment):
    cfg = experiment(tmp_path / "run", "trainer.max_steps=4", "trainer.val_every_n_steps=2",
                     "trainer.checkpoint_every_n_steps=2")
    run = run_finetune(cfg)
    path = run / METRICS_FILE
    assert RunDir(run).metrics_file == path and path.is_file()
    header = _header(path)
    assert header[0] == "step" and "train/loss" in header and "val/loss" in header and "epoch" not in header
    rows = read_metrics(path)
    train = [r["step"] for r in rows if "train/loss" in r]
    assert train == [0, 1, 2, 3]  # log_every_n_steps=1: once per step, never twice (the checkpoint step included)
    assert [r["step"] for r in rows if "val/loss" in r] == [1, 3]
    # The same run taken further: the first 4 steps' rows are kept, the new ones follow.
    more = experiment(tmp_path / "run", "trainer.max_steps=6", "trainer.val_every_n_steps=2",
                      "trainer.checkpoint_every_n_steps=2")
    run_finetune(more)
    rows2 = read_metrics(path)
    assert rows2[:len(rows)] == rows
    assert [r["step"] for r in rows2 if "train/loss" in r] == [0, 1, 2, 3, 4, 5]


def test_a_resume_replaces_the_rows_of_the_steps_it_trains_again(tmp_path):
    path = tmp_path / METRICS_FILE
    first = MetricsFile(path)
    for step in range(6):  # a run checkpointed at global step 3 that logged steps 3, 4, 5 before it was killed
        first.log_metrics({"train/loss": 10.0 - step, "epoch": 0}, step)
        first.save()
    first.log_metrics({"val/loss": 9.5}, 2)
    first.save()
    second = MetricsFile(path)
    second.continue_from(3)
    second.log_metrics({"val/loss": 9.5}, 2)  # the validation of the checkpoint's step, run again: not twice
    second.log_metrics({"train/loss": 1.5, "lr": 1e-4}, 3)
    second.log_metrics({"train/loss": 1.5}, 3)  # the same value again at the same step: one row
    second.save()
    assert _header(path) == ["step", "lr", "train/loss", "val/loss"]
    assert read_metrics(path) == [{"step": 0, "train/loss": 10.0}, {"step": 1, "train/loss": 9.0},
                                  {"step": 2, "train/loss": 8.0}, {"step": 2, "val/loss": 9.5},
                                  {"step": 3, "train/loss": 1.5, "lr": 1e-4}]


@pytest.mark.parametrize(("value", "expected"), [
    ("[tensorboard]", "trainer.loggers has 'tensorboard' (TensorBoard and metrics.csv are always written); "
                      "allowed: ['wandb', 'mlflow']"),
    ("[comet]", "trainer.loggers has 'comet'; allowed: ['wandb', 'mlflow']"),
    ("[wandb,wandb]", "trainer.loggers names a logger twice: ['wandb', 'wandb']"),
])
def test_unknown_loggers_are_refused(value, expected):
    with pytest.raises(ValueError) as err:
        load_experiment([f"trainer.loggers={value}"])
    assert expected in str(err.value)


@pytest.mark.parametrize("name", ["wandb", "mlflow"])
@pytest.mark.parametrize("dry_run", [True, False])
def test_a_logger_whose_package_is_missing_is_one_line_before_anything_is_written(
        tmp_path, monkeypatch, capsys, cli_logs, name, dry_run):
    monkeypatch.setitem(sys.modules, name, None)  # not importable, whether or not it is installed here
    run = tmp_path / "run"
    argv = ["finetune", "model=nano", f"run_dir={run}", "trainer.max_steps=1", f"trainer.loggers=[{name}]"]
    assert main(argv + (["--dry-run"] if dry_run else [])) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"recurlen finetune: error: trainer.loggers=[{name}] needs the {name} package, which is not "
                   f"installed here: pip install {name} (or leave {name} out of trainer.loggers)"]
    assert not run.exists()


def test_one_bare_logger_name_is_a_one_element_list():
    # omegaconf refused it: "trainer.loggers: Invalid value assigned: AnyNode is not a ListConfig ..."
    assert load_experiment(["trainer.loggers=wandb"])[0].trainer.loggers == ["wandb"]
    assert load_experiment(["trainer.loggers=wandb,mlflow"])[0].trainer.loggers == ["wandb", "mlflow"]
    assert load_experiment(["trainer.loggers=[mlflow]"])[0].trainer.loggers == ["mlflow"]


def test_every_missing_logger_package_is_named_in_the_one_line(tmp_path, monkeypatch, capsys, cli_logs):
    for name in ("wandb", "mlflow"):
        monkeypatch.setitem(sys.modules, name, None)
    run = tmp_path / "run"
    assert main(["finetune", "model=nano", f"run_dir={run}", "trainer.loggers=[wandb,mlflow]", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["recurlen finetune: error: trainer.loggers=[wandb,mlflow] needs the packages wandb and mlflow, "
                   "which are not installed here: pip install wandb mlflow (or leave them out of trainer.loggers)"]
    assert not run.exists()


def test_the_plan_says_where_the_run_logs(tmp_path, capsys, cli_logs):
    run = tmp_path / "run"
    assert main(["finetune", "model=nano", f"run_dir={run}", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"logs         TensorBoard {run / 'tb'}, CSV {run / METRICS_FILE}" in out


def test_wandb_runs_offline_in_the_run_directory(tmp_path, experiment, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = run_finetune(experiment(tmp_path / "run", "trainer.loggers=[wandb]"))
    assert list((run / "wandb").glob("offline-run-*"))
    assert (run / METRICS_FILE).is_file()


def test_mlflow_writes_a_local_store_in_the_run_directory(tmp_path, experiment, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run = run_finetune(experiment(tmp_path / "run", "trainer.loggers=[mlflow]"))
    assert (run / "mlruns").is_dir() and any((run / "mlruns").iterdir())
