"""The training bar is the only bar before the first step (no Lightning `Training: 0/?` line), a resumed run's bar
starts where it resumed, and validation is announced, its bars saying that they are validation and what they
measure (an end-of-run validation can take longer than a short run's steps)."""

import re
import subprocess
import sys


def finetune(run_dir, cache, steps):
    cmd = [sys.executable, "-m", "recurlen", "finetune", "model=nano", f"trainer.max_steps={steps}",
           f"run_dir={run_dir}", "data.max_documents=60", "data.val_fraction=0.2", "data.seq_len=16",
           "data.val_length=64", "data.val_sequences=2", "trainer.val_every_n_steps=0", "trainer.limit_val_batches=1",
           "trainer.num_threads=1", "trainer.progress_bar=true"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env={"PATH": "/usr/bin:/bin", "RECURLEN_CACHE": str(cache)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [line for line in re.split(r"[\r\n]", proc.stdout + proc.stderr) if line.strip()]


def test_one_step_bar_labelled_validation_and_a_resume_that_starts_where_it_left_off(tmp_path):
    lines = finetune(tmp_path / "run", tmp_path / "cache", 3)
    bars = [line for line in lines if re.search(r"\|\s*[\d.]+k?/", line)]
    assert bars and bars[0].startswith("train:") and re.search(r"\| 0/3 ", bars[0]), bars[:3]
    text = "\n".join(lines)
    for stray in ("Training", "Validation", "DataLoader", "Epoch", "?it/s", "?stage/s"):
        assert stray not in text, (stray, text[-3000:])
    announced = [line for line in lines if "validation at step" in line]
    assert len(announced) == 1 and announced[0].endswith(
        "validation at step 3/3 (end of run): in-context loss, position-wise loss + reset control, state norm")
    assert "validation (in-context loss, 1 batches)" in text
    assert "validation (position-wise loss + reset control, 2 sequences)" in text
    assert "validation (state norm, 2 sequences)" in text

    again = finetune(tmp_path / "run", tmp_path / "cache", 5)  # resumes at step 3
    bars = [line for line in again if line.startswith("train:")]
    assert re.search(r"\| 3/5 ", bars[0]), bars[:3]
