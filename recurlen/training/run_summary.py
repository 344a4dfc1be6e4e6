"""What a finished run says last: its latest validation's numbers, read from its metrics.csv, and what to run next.

The numbers are those the run logged (val/loss on the held-out segments, full - reset per position bin on the long
held-out sequences); nothing is evaluated again. A row Lightning logs at step s is the model after s + 1 optimizer
steps (recurlen.evaluation.steps_curve says why).
"""

from __future__ import annotations

import re

from recurlen.training.csv_logger import read_metrics
from recurlen.training.run_dir import RunDir

_FULL_MINUS_RESET = re.compile(r"^val/full_minus_reset@(\[.*\))$")


def shown_bin(name: str) -> str:
    """A logged bin's tag as the report names it: '[01T,02T)' -> '[T,2T)', '[0128,0256)' -> '[128,256)'."""
    bare = re.sub(r"(?<![\d.])0+(\d)", r"\1", name)
    return re.sub(r"(?<![\d.])1T", "T", bare)


def last_validation(run: RunDir) -> tuple[int, dict[str, float]] | None:
    """(optimizer steps done, the val/* scalars) of the run's latest validation; None when it logged none."""
    for row in reversed(read_metrics(run.metrics_file)):
        scalars = {k: v for k, v in row.items() if k.startswith("val/")}
        if scalars:
            return int(row["step"]) + 1, scalars
    return None


def validation_line(run: RunDir) -> str:
    """'last validation (step 750): loss 1.234 on the held-out segments; full - reset +0.012 in [T,2T), ...'."""
    found = last_validation(run)
    if found is None:
        return "no validation was logged (data.val_segments=0 and data.val_sequences=0 turn it off)"
    step, scalars = found
    parts = []
    if "val/loss" in scalars:
        parts.append(f"loss {scalars['val/loss']:.3f} on the held-out segments")
    bins = [(shown_bin(m.group(1)), v) for k, v in scalars.items() if (m := _FULL_MINUS_RESET.match(k))]
    if bins:
        parts.append("full - reset " + ", ".join(f"{v:+.3f} in {name}" for name, v in bins)
                     + " (> 0: the longer context hurts)")
    other = ", ".join(f"{k} {v:.4g}" for k, v in scalars.items())  # a task's own validation scalars
    return f"last validation (step {step}): " + ("; ".join(parts) or other)


def finished_lines(run: RunDir) -> list[str]:
    """The lines a finished `recurlen finetune` ends with: where the run is, its validation, the next command."""
    where = str(run.path)
    return [f"run directory: {where} (tensorboard --logdir {where})", validation_line(run),
            f"next: make eval RUNS={where} (its loss by position with the reset control, and a report, in runs/eval; "
            f"without make: recurlen eval {where} --out runs/eval, then recurlen report runs/eval --out runs/eval)"]


__all__ = ["finished_lines", "last_validation", "shown_bin", "validation_line"]
