"""Fault injection, continued: damaged checkpoints, changed settings on resume, non-finite values, damaged
fitted-noise files, and a signal to a demo stage. Real processes on the nano model; each fault either resumes to
exactly the uninterrupted run or stops with one clear line, and nothing earlier is lost (the README's table).
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recurlen.runs import checkpoint_step
from test_faults import REPO, env

pytestmark = pytest.mark.slow


# ---- a signal to a demo stage ------------------------------------------------------------------------------------

DEMO = ["pretrain_steps=400", "posttrain_steps=3", "interventions=[none]",
        "overrides=[data.max_documents=60,data.val_length=128,data.val_sequences=2,"
        "trainer.val_every_n_steps=1000,trainer.checkpoint_every_n_steps=10]",
        "eval.length=256", "eval.num_sequences=4", "eval.effrem=false", "eval.chunk_len=64", "eval.batch_size=4"]


def _stage_pid(demo_pid: int) -> int | None:
    path = Path(f"/proc/{demo_pid}/task/{demo_pid}/children")
    kids = path.read_text().split() if path.exists() else []
    return int(kids[0]) if kids else None


@pytest.mark.parametrize("to", ["stage", "demo"])
def test_sigterm_to_a_demo_stage_leaves_it_not_done_and_resumable(tmp_path, to):
    root = tmp_path / "demo"
    stage = root / "pretrain"
    cmd = [sys.executable, "-m", "recurlen.cli", "demo", f"run_root={root}", *DEMO]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env(RECURLEN_CACHE=str(tmp_path / "cache")),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not (stage / "checkpoints" / "step=000010.ckpt").is_file():  # training has begun
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.2)
    os.kill(_stage_pid(proc.pid) if to == "stage" else proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=300)

    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "recurlen demo: interrupted by SIGTERM after step" in err and "resumable" in err, err[-3000:]
    assert "Traceback" not in err
    reached = checkpoint_step(stage / "checkpoints" / "last.ckpt")
    assert reached is not None and 10 <= reached < 400  # the stage's own checkpoint, short of the plan
    assert not (stage / "stage_done.json").exists()  # not taken as done: a rerun continues the stage
    assert not (root / "post").exists() and not (root / "report.md").exists()
