"""Progress: a step bar for training, the demo's bar following its stages' steps, log lines above bars."""

import subprocess
import sys

from recurlen.commands.demo import STEP_BAR, _follow


def test_training_shows_a_step_bar_with_tokens_per_second(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "recurlen", "finetune", "model=nano", "trainer.max_steps=3",
                           f"run_dir={tmp_path / 'run'}", "data.max_documents=60", "data.val_fraction=0.2",
                           "data.seq_len=16",
                           "data.val_length=64", "data.val_sequences=1", "trainer.val_every_n_steps=0",
                           "trainer.limit_val_batches=1", "trainer.num_threads=1"],
                          capture_output=True, text=True, timeout=600, env={"PATH": "/usr/bin:/bin",
                                                                              "RECURLEN_CACHE": str(tmp_path / "c")})
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout + proc.stderr
    final = [m.groups() for m in STEP_BAR.finditer(out)]
    assert final and final[-1] == ("3", "3"), out[-2000:]
    assert "tok/s=" in out and "Epoch" not in out


def test_the_demo_follows_a_stage_bar_and_keeps_its_log_clean(tmp_path):
    script = ("import sys, time\n"
              "for n in range(1, 4):\n"
              "    sys.stdout.write(f'\\rtrain:  {n * 33}%|##  | {n}/3 [00:01<00:02, 1.0step/s, loss=5.5]')\n"
              "    sys.stdout.flush(); time.sleep(0.05)\n"
              "sys.stdout.write('\\nlog line\\n')\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    steps = []
    with open(tmp_path / "train.log", "w") as log:
        _follow(proc, log, lambda n, total: steps.append((n, total)))
    proc.wait()
    assert steps[-1] == (3, 3) and {s for s, _ in steps} == {1, 2, 3}
    want = "train:  99%|##  | 3/3 [00:01<00:02, 1.0step/s, loss=5.5]\nlog line\n"
    assert (tmp_path / "train.log").read_text() == want
