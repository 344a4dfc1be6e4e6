"""`recurlen eval`: evaluate checkpoints on held-out long sequences (results.json + PNGs).

    recurlen eval runs/demo/post/tbptt base=runs/demo/pretrain --out runs/eval seq_len=1024 num_sequences=32
    recurlen eval state-spaces/mamba2-780m --data pg19 seq_len=131072 num_sequences=8 bf16=true

Checkpoints are run dirs, .ckpt files, official directories or cached hub ids, optionally "label=path".
`key=value` words set EvalConfig fields; `data.key=value` words set the held-out data. The held-out
sequences come from the first run's own data config (its validation split), else from --data.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import fields
from pathlib import Path

import torch
from omegaconf import OmegaConf

log = logging.getLogger(__name__)


def _run_data_config(path: str):
    """The DataConfig a recurlen run trained with (from its config.yaml), or None."""
    from recurlen.data.config import DataConfig
    from recurlen.runs import run_config

    data = (run_config(path) or {}).get("data")
    return None if not data else OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(DataConfig), data))


def build_data_config(first_checkpoint: str, data_group: str | None, data_overrides: list[str]):
    from recurlen.data.config import DataConfig
    from recurlen.experiment.compose import experiments_dir

    cfg = None if data_group else _run_data_config(first_checkpoint)
    if cfg is None:
        group = data_group or "embedded"
        path = experiments_dir() / "data" / f"{group}.yaml"
        if not path.is_file():
            raise ValueError(f"unknown data {group!r}; allowed: {sorted(p.stem for p in path.parent.glob('*.yaml'))}")
        cfg = OmegaConf.merge(OmegaConf.structured(DataConfig), OmegaConf.load(path))
    else:
        cfg = OmegaConf.structured(cfg)
    if data_overrides:
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist([d[len("data."):] for d in data_overrides]))
    return OmegaConf.to_object(cfg)


def cmd_eval(argv: list[str]) -> int:
    from recurlen.data.datamodule import RecurlenDataModule
    from recurlen.eval.runner import EvalConfig, run_eval

    parser = argparse.ArgumentParser(prog="recurlen eval", description=__doc__.split("\n\n")[0])
    parser.add_argument("items", nargs="+", help="checkpoints ([label=]path) and key=value settings")
    parser.add_argument("--out", default=None, help="output directory (default runs/eval)")
    parser.add_argument("--data", default=None, help="data group for the held-out sequences (default: the run's)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads on CPU")
    ns = parser.parse_args(argv)
    names = {f.name for f in fields(EvalConfig)}
    checkpoints, settings, data_overrides = [], [], []
    for item in ns.items:
        key = item.split("=", 1)[0]
        if item.startswith("data."):
            data_overrides.append(item)
        elif "=" in item and key in names:
            settings.append(item)
        else:
            checkpoints.append(item)
    if ns.threads:
        torch.set_num_threads(ns.threads)
    base = OmegaConf.structured(EvalConfig(checkpoints=checkpoints, output_dir=ns.out or "runs/eval"))
    cfg = OmegaConf.to_object(OmegaConf.merge(base, OmegaConf.from_dotlist(settings)))
    first = cfg.labelled_checkpoints()[0][1]
    data_cfg = build_data_config(first, ns.data, data_overrides)
    dm = RecurlenDataModule(data_cfg)
    dm.setup("validate")
    length = cfg.seq_len or data_cfg.long_val_length
    if cfg.seq_len is None:
        cfg.seq_len = length
    sequences = dm.long_validation_sequences(length=length, num=cfg.num_sequences)
    run_eval(cfg, sequences)
    log.info("wrote %s", Path(cfg.output_dir) / "results.json")
    return 0


def cmd_report(argv: list[str]) -> int:
    from recurlen.report import write_report

    parser = argparse.ArgumentParser(prog="recurlen report", description="Markdown report from results.json files")
    parser.add_argument("results", nargs="+", help="results.json files or directories holding one")
    parser.add_argument("--out", required=True, help="directory for report.md, results.json and the plots")
    parser.add_argument("--title", default=None)
    ns = parser.parse_args(argv)
    path = write_report(ns.results, out_dir=ns.out, title=ns.title)
    log.info("wrote %s", path)
    return 0


def cmd_demo(argv: list[str]) -> int:
    from recurlen.demo import load_demo_config, run_demo

    root = run_demo(load_demo_config(argv))
    print((root / "report.md").read_text())  # noqa: T201 - the demo's output is the report
    return 0
