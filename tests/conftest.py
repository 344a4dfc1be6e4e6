"""Shared test setup."""

import pytest
import torch

# One thread per test process: the suite also starts subprocesses (DDP, multi-node), and oversubscribed
# cores make small-tensor work orders of magnitude slower than it is.
torch.set_num_threads(1)


@pytest.fixture
def run_tiny_task(tmp_path):
    """`recurlen <task>` on the nano model with quick trainer settings, in tmp_path/run -> results.json path."""
    from recurlen.tasks.config import load_task_experiment
    from recurlen.tasks.runner import run_task

    def run(task: str, *overrides: str):
        cfg = load_task_experiment([
            f"experiment={task}", "model=nano", "trainer.progress_bar=false", "trainer.num_threads=1",
            "trainer.limit_val_batches=1", "task.val_batches=1", f"run_dir={tmp_path}/run", *overrides])
        return run_task(cfg)

    return run
