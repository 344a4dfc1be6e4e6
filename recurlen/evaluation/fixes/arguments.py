"""The `fixes=[...]` / `fix.KEY.SETTING=VALUE` / `fix_base=` arguments, and applying one fix to a loaded model: the
one place `recurlen eval` and the task commands (passkey, niah) read and apply them.

    check_arguments(fixes, fix, what="eval")                 # repeats, stray settings, unknown fixes: one line
    for key, fix, cfg in fix_configs(fixes, fix):
        entry = apply_fix(model, key, fix, cfg, base="base", rows=held_out, length=L, train_len=T)

`fixes` lists NAME (its own key) or KEY=NAME (one fix twice with other settings); `fix` maps each KEY to its settings.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from recurlen.diagnostics.model_access import available_length, select_sequences
from recurlen.evaluation.fixes import Fix, get
from recurlen.util.errors import user_input

log = logging.getLogger(__name__)


def fix_keys(fixes: list[str]) -> list[tuple[str, str]]:
    """[(key, fix name)] of `fixes`: KEY=NAME, or NAME as its own key."""
    return [(spec.partition("=")[0], spec.partition("=")[2]) if "=" in spec else (spec, spec) for spec in fixes]


def fix_configs(fixes: list[str], settings: dict[str, Any]) -> list[tuple[str, Fix, Any]]:
    """[(key, fix, its typed settings)] in the order of `fixes`; an unknown fix or setting is a UserError."""
    out = []
    for key, name in fix_keys(fixes):
        fix = get(name)
        out.append((key, fix, fix.make_config(settings.get(key), key=key)))
    return out


def normalise(fixes, settings) -> tuple[list[str], dict[str, dict]]:
    """omegaconf's ListConfig / DictConfig (or None) as plain lists and dicts."""
    return [str(f) for f in fixes or []], {str(k): dict(v or {}) for k, v in dict(settings or {}).items()}


def check_arguments(fixes: list[str], settings: dict[str, Any], *, what: str) -> None:
    """ValueError (one line) for a repeated key or settings of a key not in `fixes`; the fixes' own checks after."""
    keys = [key for key, _ in fix_keys(fixes)]
    if len(set(keys)) != len(keys):
        raise ValueError(f"{what}: fixes repeat a key: {fixes} (write KEY=NAME to give one fix twice)")
    stray = sorted(set(settings) - set(keys))
    if stray:
        raise ValueError(f"{what}: settings for fixes {stray} that are not in fixes={fixes}")
    fix_configs(fixes, settings)  # unknown fixes and settings fail here, before anything loads


def calibration_rows(fixes: list[str], settings: dict[str, Any]) -> int:
    """Held-out sequences the fixes' calibrations need (the most any one needs)."""
    return max([cfg.rows_needed() for _, _, cfg in fix_configs(fixes, settings)], default=0)


def describe(fixes: list[str], settings: dict[str, Any]) -> str:
    """The dry run's words for the fixes: each key with its fix and every setting."""
    return "; ".join(f"{key} ({fix.name}: {', '.join(f'{k}={v}' for k, v in vars(c).items())})"
                     for key, fix, c in fix_configs(fixes, settings))


def apply_fix(model: torch.nn.Module, key: str, fix: Fix, cfg: Any, *, base: str, rows, length: int | None,
              train_len: int) -> dict:
    """Apply one fix to `model` in place, calibrated on the first held-out `rows` cut to cfg.length (else `length`,
    else what the rows hold) -> the results' `fix` entry: the FixRecord, its key, the base and the seconds."""
    fix.check_model(model)
    calibration = None
    need = cfg.rows_needed()
    if need and rows is not None and len(rows) >= need:
        cut = cfg.length or length or available_length(rows, cfg.sequences)
        with user_input():
            calibration = select_sequences(rows, length=cut, num=cfg.sequences, what=f"fix {fix.name} calibration")
    started = time.perf_counter()
    record = fix.apply(model, cfg, calibration=calibration, train_len=train_len)
    seconds = time.perf_counter() - started
    log.info("fix %s (%s) on %s: %s in %.1f s", key, fix.name, base, record.values, seconds)
    return {**record.to_dict(), "key": key, "base": base, "seconds": seconds}


__all__ = ["apply_fix", "calibration_rows", "check_arguments", "describe", "fix_configs", "fix_keys", "normalise"]
