"""A run says how many steps it trains and, after its first steps, about how long they take; it ends with its last
validation's numbers and the command that evaluates it; a run with nothing to validate on says nothing of
validation (no announcement, no empty bar)."""

import re
import subprocess
import sys

import pytest

from recurlen.training.csv_logger import read_metrics
from recurlen.training.pace import duration, validations_due
from recurlen.training.run_summary import shown_bin

TINY = ["model=nano", "data.max_documents=60", "data.val_fraction=0.2", "data.seq_len=16", "data.batch_size=4",
        "data.val_length=64", "data.val_sequences=2", "trainer.limit_val_batches=1", "trainer.num_threads=1",
        "trainer.accelerator=cpu"]


def finetune(run_dir, cache, *words):
    cmd = [sys.executable, "-m", "recurlen", "finetune", *TINY, f"run_dir={run_dir}", *words]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env={"PATH": "/usr/bin:/bin", "RECURLEN_CACHE": str(cache)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [line for line in re.split(r"[\r\n]", proc.stdout + proc.stderr) if line.strip()]


def validations_logged(run_dir) -> int:
    return sum(1 for row in read_metrics(run_dir / "metrics.csv") if "val/loss" in row)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run of 7 steps validated every 2: its directory and its output lines."""
    root = tmp_path_factory.mktemp("pace")
    run_dir = root / "run"
    return run_dir, finetune(run_dir, root / "cache", "trainer.max_steps=7", "trainer.val_every_n_steps=2",
                             "trainer.progress_bar=false")


def test_the_run_says_its_steps_then_their_time_and_ends_with_its_validation_and_the_next_command(trained):
    run_dir, lines = trained
    said = [line.split(": ", 1)[1] for line in lines if re.match(r"\d\d:\d\d:\d\d recurlen", line)]
    start = next(s for s in said if s.startswith("training "))
    # Lightning validates at every multiple of val_every_n_steps and not at a last step off that grid: 2, 4, 6.
    assert validations_logged(run_dir) == validations_due(0, 7, 2) == 3
    assert start == "training 7 steps to step 7, 3 validations (every 2 steps); the time they take is said after the " \
                    "first 4"
    pace = next(s for s in said if s.startswith("about "))
    assert re.fullmatch(r"about \d+ s for the 3 steps left \([\d.e-]+ s per step over steps 2-4\), plus 2 validations "
                        r"\(every 2 steps\)", pace), pace
    last = next(row for row in reversed(read_metrics(run_dir / "metrics.csv")) if "val/loss" in row)
    assert said[-3] == f"run directory: {run_dir} (tensorboard --logdir {run_dir})"
    assert said[-2].startswith(f"last validation (step 6): loss {last['val/loss']:.3f} on the held-out segments; "
                               f"full - reset {last['val/full_minus_reset@[1T,2T)']:+.3f} in [T,2T), ")
    assert said[-1].startswith(f"next: make eval RUNS={run_dir} ")  # it used to end with the run directory alone


def test_a_run_without_held_out_data_says_nothing_of_validation(tmp_path):
    lines = finetune(tmp_path / "run", tmp_path / "cache", "trainer.max_steps=3", "data.layout=packed",
                     "data.val_segments=0", "data.val_sequences=0", "trainer.progress_bar=true")
    text = "\n".join(lines)
    assert "validation at step" not in text and "validation (in-context loss" not in text, text[-3000:]
    assert "training 3 steps to step 3, no validation (data.val_segments=0, data.val_sequences=0)" in text
    assert "no validation was logged (data.val_segments=0 and data.val_sequences=0 turn it off)" in text
    assert validations_logged(tmp_path / "run") == 0


@pytest.mark.parametrize(("start", "max_steps", "every", "due"), [
    (0, 750, 250, 3), (0, 7, 2, 3), (0, 8, 2, 4), (4, 8, 2, 2), (3, 8, 2, 3), (0, 5, 0, 1), (0, 5, 10, 1), (5, 5, 2, 0),
])
def test_validations_due_counts_the_multiples_of_the_interval(start, max_steps, every, due):
    assert validations_due(start, max_steps, every) == due


def test_durations_and_bin_names_read_as_the_report_writes_them():
    assert [duration(s) for s in (40, 210, 7200)] == ["40 s", "3.5 min", "2.0 h"]
    assert [shown_bin(b) for b in ("[1T,2T)", "[01T,02T)", "[08T,16T)", "[0128,0256)", "[0,1T)")] == \
           ["[T,2T)", "[T,2T)", "[8T,16T)", "[128,256)", "[0,T)"]
