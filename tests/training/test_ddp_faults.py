"""Faults of a 2-process DDP run on CPU (gloo): a rank lost to kill -9, and SIGTERM to one rank.

A lost rank: the survivor stops promptly with one line that names the lost rank and the command that resumes the
run (no gloo traceback), and that command, run as printed, ends bitwise equal to an uninterrupted run. A SIGTERM
stops every rank at the same step and is said once, by rank 0.
"""

import ctypes
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from recurlen.training.run_dir import RunDir

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
STEPS = 40
DDP = ("trainer.devices=2", "trainer.strategy=ddp")
PR_SET_CHILD_SUBREAPER = 36


def args(run_dir, cache_dir, *extra):
    return [sys.executable, "-m", "recurlen", "finetune", "model=nano", "intervention=state_passing",
            "data.seq_len=16", "data.batch_size=2", "data.val_length=64", "data.val_sequences=2",
            "data.val_segments=8", "data.val_fraction=0.2", f"data.cache_dir={cache_dir}", "data.max_documents=60",
            f"trainer.max_steps={STEPS}", "trainer.val_every_n_steps=0", "trainer.limit_val_batches=1",
            "trainer.checkpoint_every_n_steps=10", "trainer.progress_bar=false", "trainer.accelerator=cpu",
            "trainer.num_threads=1", "diagnostics.positionwise=false", "diagnostics.state_norm=false",
            "optim.lr=1e-3", *DDP, f"run_dir={run_dir}", *extra]


def env(**extra):
    drop = ("SLURM_", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_", "RANK", "GROUP_RANK", "RECURLEN_FAULT")
    out = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    out.update({"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "MASTER_PORT": port, **extra})
    return out


def weights(run_dir):
    ckpt = torch.load(RunDir(run_dir).last_checkpoint, weights_only=True)
    return ckpt["global_step"], ckpt["state_dict"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, cache_dir):
    out = tmp_path_factory.mktemp("ddp-reference") / "run"
    proc = subprocess.run(args(out, cache_dir), cwd=REPO, env=env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _alive(pid):
    """Whether pid runs (a zombie, ended but not reaped yet, has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def _children(pid):
    return [int(x) for t in Path(f"/proc/{pid}/task").glob("*/children") for x in t.read_text().split()]


@pytest.mark.parametrize("lost", [0, 1], ids=["kill-rank0", "kill-rank1"])
def test_a_lost_rank_is_one_line_naming_it_and_the_printed_command_resumes(tmp_path, cache_dir, reference, lost):
    out = tmp_path / "run"
    # This process adopts rank 1 when rank 0, its parent, dies: its exit status can then be read.
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    try:
        fault = f"point=train,step=20,moment=batch_start,action=kill,rank={lost}"  # kill -9 at step 21's start
        proc = subprocess.Popen(args(out, cache_dir), cwd=REPO, env=env(RECURLEN_FAULT=fault),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        err: list[str] = []
        for line in proc.stderr:
            err.append(line)
            if "writes a checkpoint after the current step" in line:
                break
        kids = _children(proc.pid)
        assert len(kids) == 1, err
        pids = {0: proc.pid, 1: kids[0]}
        reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)
        reader.start()
        died: dict[int, float] = {}
        deadline = time.monotonic() + 300
        while len(died) < 2 and time.monotonic() < deadline:
            for rank, pid in pids.items():
                if rank not in died and not _alive(pid):
                    died[rank] = time.monotonic()
            time.sleep(0.01)
        assert len(died) == 2, "".join(err)[-3000:]
        survivor = 1 - lost
        if lost == 1:
            proc.wait(timeout=60)
            survivor_code = proc.returncode
        else:
            assert proc.wait(timeout=60) == -signal.SIGKILL
            survivor_code = os.waitstatus_to_exitcode(os.waitpid(pids[1], 0)[1])
        reader.join(timeout=60)
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
    stderr = "".join(err)
    assert survivor_code == 2, stderr[-3000:]
    seconds = died[survivor] - died[lost]
    assert 0 <= seconds < 20, f"the survivor took {seconds:.1f} s to stop"
    assert "Traceback" not in stderr and "[rank" not in stderr and "Connection" not in stderr, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("recurlen finetune: error:")]
    assert len(errors) == 1, stderr[-3000:]
    line = errors[0]
    assert f"rank {lost} (pid {pids[lost]} on this host" in line and "of 2 was lost at step 20" in line, line
    assert f"(this is rank {survivor})" in line, line
    assert f"resumes exactly from {RunDir(out).last_checkpoint} (step 20)" in line, line
    if lost == 1:  # the launching process knows how its child ended
        assert "killed by SIGKILL" in line, line
    assert weights(out)[0] == 20
    # The command the line gives, run as printed (but for the interpreter), continues the run to the reference.
    command = shlex.split(line.split("resume with: ", 1)[1])
    assert command[:2] == ["recurlen", "finetune"] and f"run_dir={out}" in command
    again = subprocess.run([sys.executable, "-m", *command], cwd=REPO, env=env(), capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming from" in again.stderr and "(step 20)" in again.stderr
    (got_step, got), (want_step, want) = weights(out), weights(reference)
    assert got_step == want_step == STEPS
    assert all(torch.equal(got[k], want[k]) for k in want), "the resumed run differs from the uninterrupted one"


@pytest.mark.parametrize("signalled", [0, 1], ids=["sigterm-rank0", "sigterm-rank1"])
def test_sigterm_to_one_rank_is_said_once(tmp_path, cache_dir, signalled):
    out = tmp_path / "run"
    fault = f"point=train,step=5,moment=after_backward,action=signal,signal=SIGTERM,rank={signalled}"
    proc = subprocess.run(args(out, cache_dir), cwd=REPO, env=env(RECURLEN_FAULT=fault), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 143, proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if "interrupted by SIGTERM after step" in line]
    assert len(said) == 1 and said[0].startswith("recurlen finetune: interrupted by SIGTERM after step 6"), said
    assert weights(out)[0] == 6
