"""A diverged run: the advice names a checkpoint from before the divergence began, and following it works.

The case that made this module: at optim.lr=50 the loss climbs from the first step, the checkpoints written while
it climbs are finite but already diverged, and a step goes non-finite later. Advice to resume the newest finite
checkpoint at a lower rate failed at any rate; the advice now starts from before the climb, and the test runs
the printed command literally.
"""

import math
import shlex
import subprocess
import sys

import lightning as L
import pytest
import torch
from omegaconf import OmegaConf
from test_faults import args, env

from recurlen.training.divergence import Health, onset
from recurlen.training.finetune import run_finetune
from recurlen.util.errors import NonFinite

REPO_RUN = ("trainer.max_steps=12", "trainer.checkpoint_every_n_steps=2", "trainer.val_every_n_steps=0")


def _history(losses, grads=None):
    grads = grads or [1.0] * len(losses)
    return [Health(step, loss, grad) for step, (loss, grad) in enumerate(zip(losses, grads))]


def test_onset_is_where_the_unbroken_climb_began():
    # Noise (even +30%) is healthy; the climb from step 5 on is the divergence.
    losses = [6.0, 5.0, 4.0, 4.4, 3.9, 7.0, 12.0, 30.0, 90.0]
    start, why = onset(_history(losses), failed_step=9)
    assert start == 5 and "loss 7 against a best of 3.9" in why


def test_a_sudden_nan_has_no_earlier_onset():
    assert onset(_history([6.0, 5.0, 4.0, 3.9]), failed_step=4) == (4, "")


def test_an_exploding_gradient_counts_although_the_loss_has_not_moved_yet():
    start, why = onset(_history([5.0, 4.9, 4.8, 4.8, 4.7], [1.0, 1.2, 0.9, 500.0, 9e4]), failed_step=5)
    assert start == 3 and "gradient norm 500" in why


def test_a_recovered_spike_is_not_the_onset():
    # A spike the run recovered from is history: the divergence that failed began after it.
    losses = [6.0, 5.0, 20.0, 4.5, 4.4, 9.0, math.nan]
    assert onset(_history(losses), failed_step=7)[0] == 5


@pytest.mark.slow
def test_following_the_printed_advice_literally_passes_the_failed_step(tmp_path, cache_dir):
    run_dir = tmp_path / "run"
    cmd = args(run_dir, cache_dir, "optim.lr=50", "trainer.checkpoint_every_n_steps=2")
    first = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=600)
    assert first.returncode == 2, first.stderr[-3000:]
    error = first.stderr.strip().splitlines()[-1]
    failed = int(error.split(" at global step ")[1].split(";")[0])
    assert failed > 2 and "began to diverge at step 1" in error, error
    advice = error.split(": recurlen finetune ", 1)[1]
    words = shlex.split(advice)
    assert "optim.lr=0.0001" in words and "resume=archive" in words, error
    second = subprocess.run([sys.executable, "-m", "recurlen", "finetune", *words], env=env(), capture_output=True,
                            text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 40 > failed
    assert all(torch.isfinite(v).all() for v in ckpt["state_dict"].values())
    assert list((run_dir / "archive").iterdir()), "the diverged run is kept in the archive"


class DivergeOnce(L.Callback):
    """From step `start` the final norm's weight grows 300x, then 30x a step (the loss climbs), and at `nan_at` it
    becomes NaN: a divergence with finite checkpoints in its middle. Only in the first fit: a rollback trains
    normally."""

    def __init__(self, start: int, nan_at: int) -> None:
        self.start, self.nan_at, self.done = start, nan_at, False

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.done or trainer.global_step < self.start:
            return
        with torch.no_grad():
            weight = pl_module.model.backbone.norm_f.weight
            # The first jump is large: a model a few steps from its random start predicts nearly uniformly, and
            # only a large scale of its near-zero logits shows in the loss at once.
            if trainer.global_step >= self.nan_at:
                weight.fill_(float("nan"))
            else:
                weight.mul_(300.0 if trainer.global_step == self.start else 30.0)
        self.done = trainer.global_step >= self.nan_at


def test_the_advice_skips_checkpoints_written_during_the_climb(tmp_path, experiment):
    cfg = experiment(tmp_path / "run", *REPO_RUN)
    with pytest.raises(NonFinite) as err:
        run_finetune(cfg, callbacks=[DivergeOnce(start=5, nan_at=9)])
    step4 = tmp_path / "run" / "checkpoints" / "step=000004.ckpt"
    assert (tmp_path / "run" / "checkpoints" / "step=000008.ckpt").is_file()  # finite, but inside the climb
    assert "began to diverge at step 5" in str(err.value) and f"before it is {step4} (step 4)" in str(err.value)
    assert err.value.overrides == ("optim.lr=0.00025", f"resume={step4}")


def test_on_nonfinite_rollback_reloads_lowers_the_rate_and_skips_the_batches(tmp_path, experiment):
    run = tmp_path / "run"
    cfg = experiment(run, *REPO_RUN, "trainer.on_nonfinite=rollback")
    run_finetune(cfg, callbacks=[DivergeOnce(start=5, nan_at=9)])
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 12
    assert all(torch.isfinite(v).all() for v in ckpt["state_dict"].values())
    # Steps 4..11 after the rollback read the batches after the failed step 9 (10..17): the data is 6 steps ahead.
    assert ckpt["RecurlenDataModule"]["next_step"] == 18
    history = OmegaConf.to_container(OmegaConf.load(run / "config_history.yaml"))
    rollback = next(e for e in history if e.get("event") == "rollback")
    assert rollback["failed_step"] == 9 and rollback["divergence_began"] == 5
    assert rollback["restarted_from"].endswith("step=000004.ckpt") and rollback["skipped_batches"] == "5..9"
    assert rollback["lr"] == {"from": 1e-3, "to": 2.5e-4}
    assert OmegaConf.load(run / "config.yaml").optim.lr == 2.5e-4
    archived = [p.name for p in (run / "archive").glob("rollback-*/*")]
    assert "step=000006.ckpt" in archived and "step=000008.ckpt" in archived
