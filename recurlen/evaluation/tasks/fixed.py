"""Training-free fixes on a task (`recurlen passkey|niah fixes=[...]`): each fix applied to a fresh copy of the
evaluated model (or fix_base), calibrated as `recurlen eval` calibrates, then scored on the same examples.

    entries = evaluate_fixes(cfg, source=run, device="cpu", length=max(lengths), score=lambda model: {...})

Calibration reads the base run's own held-out text (its data config, else the experiment's data): the sequences
after the first task.trials, which the niah 'heldout' haystack reads, cut to fix.KEY.length (default: the longest
evaluated length, the target). Its seed, steps, data and losses go into each entry's `fix` record.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch

from recurlen.evaluation.fixes.arguments import apply_fix, fix_configs
from recurlen.evaluation.heldout import heldout_sequences, run_data_config
from recurlen.evaluation.tasks.config import TaskExperimentConfig
from recurlen.training.run_dir import load_model

log = logging.getLogger(__name__)


def evaluate_fixes(cfg: TaskExperimentConfig, *, source: str, device: str, length: int,
                   score: Callable[[torch.nn.Module], dict]) -> list[dict]:
    """One entry per fix of cfg.fixes: {"label": BASE+KEY, "model", "fix": the record, **score(fixed model)}."""
    if not cfg.fixes:
        return []
    base_source = cfg.fix_base or source
    base = Path(str(base_source).rstrip("/")).name or str(base_source)
    data = run_data_config(base_source) or cfg.data
    skip = cfg.task.trials
    rows_by_length: dict[int, torch.Tensor] = {}
    entries = []
    for key, fix, fix_cfg in fix_configs(cfg.fixes, cfg.fix):
        loaded = load_model(base_source, backend=cfg.model.backend, device=device)
        train_len = loaded.train_seq_len or cfg.data.seq_len  # T: the unit of forget_more's memory cap
        rows = None
        if fix_cfg.rows_needed():
            cut = fix_cfg.length or length
            if cut not in rows_by_length or len(rows_by_length[cut]) < fix_cfg.rows_needed():
                rows_by_length[cut] = heldout_sequences(data, length=cut, num=skip + fix_cfg.rows_needed())[skip:]
            rows = rows_by_length[cut]
        record = apply_fix(loaded.model, key, fix, fix_cfg, base=base, rows=rows, length=length, train_len=train_len)
        if record.get("calibration"):
            record["calibration"]["data"]["rows"] = (f"held-out sequences {skip} to {skip + fix_cfg.sequences - 1} "
                                                     f"of {data.source}'s validation split")
        result = score(loaded.model.eval())
        label = f"{base}+{key}"
        log.info("%s %s: mean accuracy by length %s", cfg.task.name, label,
                 {n: round(a, 3) for n, a in result["mean_accuracy_by_length"].items()})
        entries.append({"label": label, "model": str(base_source), "fix": record, **result})
        del loaded
    return entries


__all__ = ["evaluate_fixes"]
