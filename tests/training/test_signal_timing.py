"""A stop signal writes the checkpoint first: the validation that was due (or that Lightning runs when training
stops early) is skipped, the last step is no exception (exit 128 + signal, not 0), and a signal during a validation
stops right after it. Real processes and real signals, sent by the run to itself at a chosen point, so that the
step they land in is known (tests/training/test_faults.py sends them at random moments)."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from recurlen.training.run_dir import RunDir

REPO = Path(__file__).resolve().parents[2]
STEPS = 8
VAL_EVERY = 4

# The real `recurlen finetune`, with one callback more: it sends the signal to its own process at the start of step
# `at` (its training step, or its validation when `where` is "validation") and records when validations begin and
# checkpoints are made, with the time, in a JSON file.
SIGNAL_AT = r'''
import json, os, sys, time
import lightning as L
from recurlen.training import finetune

at, signum, where, events_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
events = []

def note(kind, step):
    events.append([kind, step, time.time()])
    with open(events_path, "w") as f:
        json.dump(events, f)

class Probe(L.Callback):
    def _send(self, step):
        if not any(kind == "signal" for kind, _, _ in events):
            note("signal", step)
            os.kill(os.getpid(), signum)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if where == "step" and trainer.global_step == at - 1:  # the step that will be number `at`
            self._send(at)

    def on_validation_start(self, trainer, pl_module):
        note("validation", trainer.global_step)
        if where == "validation" and trainer.global_step == at:
            self._send(at)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        note("checkpoint", trainer.global_step)

build = finetune.build_trainer
finetune.build_trainer = lambda cfg, run, extra, **options: build(cfg, run, [*extra, Probe()], **options)
from recurlen.commands.cli import main
sys.exit(main(["finetune", *sys.argv[5:]]))
'''


def finetune_args(run_dir, cache_dir, *extra):
    return ["model=nano", "intervention=state_passing", "data.seq_len=16", "data.batch_size=2",
            "data.val_length=64", "data.val_sequences=2", "data.val_segments=8", "data.val_fraction=0.2",
            f"data.cache_dir={cache_dir}", "data.max_documents=60", f"trainer.max_steps={STEPS}",
            f"trainer.val_every_n_steps={VAL_EVERY}", "trainer.limit_val_batches=1",
            "trainer.checkpoint_every_n_steps=1000", "trainer.log_every_n_steps=1", "trainer.progress_bar=false",
            "trainer.accelerator=cpu", "trainer.num_threads=1", "diagnostics.state_norm=false", "optim.lr=1e-3",
            f"run_dir={run_dir}", *extra]


def env():
    drop = ("SLURM_", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_", "RANK", "GROUP_RANK", "RECURLEN_FAULT")
    out = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    out.update({"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    return out


def run_with_signal(tmp_path, run_dir, cache_dir, *, at, signum, where="step"):
    """(process, events) of a run that signals itself at step `at` (see SIGNAL_AT)."""
    script, events = tmp_path / "signal_at.py", tmp_path / "events.json"
    script.write_text(SIGNAL_AT)
    cmd = [sys.executable, str(script), str(at), str(int(signum)), where, str(events),
           *finetune_args(run_dir, cache_dir)]
    proc = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=600)
    return proc, [(kind, step) for kind, step, _ in json.loads(events.read_text())]


def finetune(run_dir, cache_dir):
    cmd = [sys.executable, "-m", "recurlen", "finetune", *finetune_args(run_dir, cache_dir)]
    return subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=600)


def weights(run_dir):
    ckpt = torch.load(RunDir(run_dir).last_checkpoint, weights_only=True)
    return ckpt["global_step"], ckpt["state_dict"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, cache_dir):
    """The uninterrupted run (validations at steps 4 and 8), the yardstick of the resumed ones."""
    out = tmp_path_factory.mktemp("signal-reference") / "run"
    proc = finetune(out, cache_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.mark.parametrize("at", [2, VAL_EVERY], ids=["no-validation-due", "validation-due"])
def test_signal_writes_the_checkpoint_without_validating_and_resumes_exactly(tmp_path, cache_dir, reference, at):
    """At step 2 Lightning would validate only because training stops early; at step 4 the validation is due."""
    out = tmp_path / "run"
    proc, events = run_with_signal(tmp_path, out, cache_dir, at=at, signum=signal.SIGINT)
    assert proc.returncode == 128 + signal.SIGINT, proc.stderr[-3000:]
    assert f"interrupted by SIGINT after step {at}" in proc.stderr and "Traceback" not in proc.stderr
    assert f"stopping on SIGINT after the step of step {at}: writing the checkpoint now, without the validation" \
        in proc.stderr, proc.stderr[-3000:]
    # After the signal: the checkpoint of that step, and no validation at all.
    assert events[events.index(("signal", at)) + 1:] == [("checkpoint", at)], events
    assert weights(out)[0] == at
    again = finetune(out, cache_dir)
    assert again.returncode == 0, again.stderr[-3000:]
    (got_step, got), (want_step, want) = weights(out), weights(reference)
    assert got_step == want_step == STEPS
    assert all(torch.equal(got[k], want[k]) for k in want), "the resumed run differs from the uninterrupted one"


def test_sigterm_in_the_last_step_exits_143_after_the_checkpoint(tmp_path, cache_dir):
    out = tmp_path / "run"
    proc, events = run_with_signal(tmp_path, out, cache_dir, at=STEPS, signum=signal.SIGTERM)
    assert proc.returncode == 143, proc.stderr[-3000:]
    assert f"interrupted by SIGTERM after step {STEPS}" in proc.stderr and "Traceback" not in proc.stderr
    assert events[events.index(("signal", STEPS)) + 1:] == [("checkpoint", STEPS)], events  # end-of-run val skipped
    assert weights(out)[0] == STEPS
    again = finetune(out, cache_dir)  # the run is complete: nothing left to do but say what the signal skipped
    assert again.returncode == 0, again.stderr[-3000:]
    assert "its end-of-run validation was skipped by the signal" in again.stderr and "recurlen eval" in again.stderr
    assert weights(out)[0] == STEPS


def test_signal_during_a_validation_stops_right_after_it(tmp_path, cache_dir, reference):
    """No further training step: the checkpoint holds the step that was being validated."""
    out = tmp_path / "run"
    proc, events = run_with_signal(tmp_path, out, cache_dir, at=VAL_EVERY, signum=signal.SIGTERM,
                                   where="validation")
    assert proc.returncode == 143, proc.stderr[-3000:]
    assert "received SIGTERM: finishing the validation in progress" in proc.stderr, proc.stderr[-3000:]
    assert f"stopping on SIGTERM after the validation of step {VAL_EVERY}" in proc.stderr
    assert events[events.index(("signal", VAL_EVERY)) + 1:] == [("checkpoint", VAL_EVERY)], events
    assert weights(out)[0] == VAL_EVERY
    again = finetune(out, cache_dir)
    assert again.returncode == 0, again.stderr[-3000:]
    (got_step, got), (_, want) = weights(out), weights(reference)
    assert got_step == STEPS and all(torch.equal(got[k], want[k]) for k in want)
