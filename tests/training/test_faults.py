"""Fault injection: each fault either resumes to exactly the uninterrupted run or stops with a clear message, and
nothing earlier is lost. Real processes, real signals, real kills (the README's table lists these rows).

Signals arrive at a random moment of training (single process and 2-process DDP on CPU with gloo); kill -9 hits
a checkpoint write at its start, half-way and just before the rename (RECURLEN_FAULT, see recurlen.util.faults); the
disk fills up part-way through a write (a size-limited tmpfs when this machine lets the test mount one, else the
same ENOSPC raised by the fault hook); the run directory is read-only.
"""

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from recurlen.training.run_dir import RunDir

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
STEPS = 40


def args(run_dir, cache_dir, *extra, steps=STEPS):
    return [sys.executable, "-m", "recurlen", "finetune", "model=nano", "intervention=state_passing",
            "data.seq_len=16", "data.batch_size=2", "data.val_length=64", "data.val_sequences=2",
            "data.val_segments=8", "data.val_fraction=0.2", f"data.cache_dir={cache_dir}", "data.max_documents=60",
            f"trainer.max_steps={steps}", "trainer.val_every_n_steps=0", "trainer.limit_val_batches=1",
            "trainer.checkpoint_every_n_steps=1000", "trainer.log_every_n_steps=1", "trainer.progress_bar=false",
            "trainer.accelerator=cpu", "trainer.num_threads=1", "diagnostics.positionwise=false",
            "diagnostics.state_norm=false", "optim.lr=1e-3", f"run_dir={run_dir}", *extra]


def env(**extra):
    drop = ("SLURM_", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_", "RANK", "GROUP_RANK", "RECURLEN_FAULT")
    out = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    out.update({"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **extra})
    return out


def run(cmd, **env_extra):
    return subprocess.run(cmd, cwd=REPO, env=env(**env_extra), capture_output=True, text=True, timeout=600)


def weights(run_dir):
    ckpt = torch.load(RunDir(run_dir).last_checkpoint, weights_only=True)
    return ckpt["global_step"], ckpt["state_dict"]


def assert_same_run(got_dir, want_dir):
    (got_step, got), (want_step, want) = weights(got_dir), weights(want_dir)
    assert got_step == want_step
    assert all(torch.equal(got[k], want[k]) for k in want), "resumed run differs from the uninterrupted one"


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


@pytest.fixture(scope="module")
def reference(tmp_path_factory, cache_dir):
    """One uninterrupted single-process run, the yardstick of every resumed one."""
    out = tmp_path_factory.mktemp("reference") / "run"
    proc = run(args(out, cache_dir))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _children(pid):
    """Child processes of pid, started from any of its threads (the demo starts stages from worker threads)."""
    kids = []
    for path in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(FileNotFoundError):  # the thread ended meanwhile
            kids += [int(x) for x in path.read_text().split()]
    return kids


def interrupt_during_training(cmd, signum, *, seed, to_child=False, **env_extra):
    """Start the run, wait until it is training, send `signum` at a random moment, return the finished process."""
    proc = subprocess.Popen(cmd, cwd=REPO, env=env(**env_extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    head = []
    for line in proc.stderr:  # the run says when training (and its signal handling) has begun
        head.append(line)
        if "writes a checkpoint after the current step" in line:
            break
    # Early in the run (a nano run of STEPS steps can finish within half a second on an idle machine): a signal
    # that came after the last step would test nothing, and the run would end by it instead of resuming.
    time.sleep(random.Random(seed).uniform(0.0, 0.1))
    target = proc.pid
    if to_child:
        kids = _children(proc.pid)
        assert kids, "the DDP launcher has no child rank"
        target = kids[0]
    os.kill(target, signum)
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "".join(head) + err)


@pytest.mark.parametrize(("signum", "seed"), [(signal.SIGTERM, 1), (signal.SIGUSR1, 2), (signal.SIGINT, 3)],
                         ids=["SIGTERM", "SIGUSR1", "SIGINT"])  # the names docs/fault-cases.md gives
def test_signal_checkpoints_exits_nonzero_and_resumes_exactly(tmp_path, cache_dir, reference, signum, seed):
    out = tmp_path / "run"
    proc = interrupt_during_training(args(out, cache_dir), signum, seed=seed)
    name = signal.Signals(signum).name
    assert proc.returncode == 128 + signum, proc.stderr[-3000:]
    assert f"interrupted by {name} after step" in proc.stderr and "resumable" in proc.stderr
    assert "Traceback" not in proc.stderr
    step, _ = weights(out)
    assert 0 < step < STEPS  # a checkpoint although checkpoint_every_n_steps is far away
    again = run(args(out, cache_dir))
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resuming from {RunDir(out).last_checkpoint}" in again.stderr
    assert_same_run(out, reference)


@pytest.mark.parametrize("to_child", [False, True], ids=["signal-rank0", "signal-rank1"])
def test_signal_under_ddp_stops_every_rank_at_the_same_step(tmp_path_factory, tmp_path, cache_dir, to_child):
    ddp = ("trainer.devices=2", "trainer.strategy=ddp")
    ref = tmp_path_factory.getbasetemp() / "ddp-reference"
    if not RunDir(ref).has_checkpoint():
        proc = run(args(ref, cache_dir, *ddp), MASTER_PORT=free_port())
        assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "run"
    proc = interrupt_during_training(args(out, cache_dir, *ddp), signal.SIGTERM, seed=4, to_child=to_child,
                                     MASTER_PORT=free_port())
    assert proc.returncode == 143, proc.stderr[-3000:]
    assert "interrupted by SIGTERM" in proc.stderr
    step, _ = weights(out)
    assert 0 < step < STEPS
    again = run(args(out, cache_dir, *ddp), MASTER_PORT=free_port())
    assert again.returncode == 0, again.stderr[-3000:]
    assert_same_run(out, ref)


@pytest.mark.parametrize("point", ["start", "middle", "rename"])
def test_kill_9_during_a_checkpoint_write_loses_nothing(tmp_path, cache_dir, reference, point):
    out = tmp_path / "run"
    every = ("trainer.checkpoint_every_n_steps=10",)
    # The second write of last.ckpt (step 20) is killed; step=000010.ckpt and step=000020.ckpt were written before.
    proc = run(args(out, cache_dir, *every), RECURLEN_FAULT=f"point={point},file=last.ckpt,skip=1,action=kill")
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert weights(out)[0] == 10  # the earlier last.ckpt is whole: the torn write never replaced it
    again = run(args(out, cache_dir, *every))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming from" in again.stderr
    assert_same_run(out, reference)
    assert torch.load(out / "checkpoints" / "step=000010.ckpt", weights_only=True)["global_step"] == 10
    # The killed write's temporary (a whole checkpoint when cut at the rename) was removed by the resumed run.
    assert not list((out / "checkpoints").glob(".*.tmp"))
    assert "the temporary of a write that was interrupted" in again.stderr or point == "start"


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    try:
        return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                              capture_output=True).returncode == 0
    except FileNotFoundError:
        return False


def _umount(path: Path) -> None:
    subprocess.run(["umount", str(path)], capture_output=True)


def test_full_disk_is_a_clear_error_and_the_run_resumes(tmp_path, cache_dir, reference):
    out = tmp_path / "run"
    every = ("trainer.checkpoint_every_n_steps=10",)
    mount = tmp_path / "small"
    # A checkpoint of the nano run is ~0.9 MB; 2.5 MB holds the run's first files but not every later checkpoint.
    if _mount_tmpfs(mount, "2500k"):
        try:
            small = mount / "run"
            proc = run(args(small, cache_dir, *every))
            assert proc.returncode != 0
            assert "no space left on device" in proc.stderr.lower() and "Traceback" not in proc.stderr
            step, _ = weights(small)
            assert step in (10, 20, 30)  # what was written before the disk filled up is intact
            subprocess.run(["cp", "-a", str(small), str(out)], check=True)
        finally:
            _umount(mount)
    else:
        proc = run(args(out, cache_dir, *every), RECURLEN_FAULT="point=middle,file=last.ckpt,skip=1,action=enospc")
        assert proc.returncode != 0
        assert "no space left on device" in proc.stderr.lower() and "Traceback" not in proc.stderr
        assert weights(out)[0] == 10
    assert "free" in proc.stderr.lower()
    again = run(args(out, cache_dir, *every))
    assert again.returncode == 0, again.stderr[-3000:]
    assert_same_run(out, reference)


@pytest.mark.skipif(os.geteuid() == 0 and not _mount_tmpfs(Path("/tmp/.recurlen-mount-probe"), "1m"),
                    reason="root ignores file modes and no read-only filesystem can be mounted here")
def test_read_only_run_dir_is_a_clear_error(tmp_path, cache_dir):
    _umount(Path("/tmp/.recurlen-mount-probe"))
    out = tmp_path / "ro"
    if os.geteuid() == 0:
        assert _mount_tmpfs(out, "1m")
        subprocess.run(["mount", "-o", "remount,ro", str(out)], check=True)
    else:
        out.mkdir()
        out.chmod(0o555)
    try:
        proc = run(args(out / "run", cache_dir, steps=2))
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr
        assert "read-only" in proc.stderr.lower() or "permission denied" in proc.stderr.lower()
    finally:
        if os.geteuid() == 0:
            _umount(out)
        else:
            out.chmod(0o755)



@pytest.mark.skipif(not _mount_tmpfs(Path("/tmp/.recurlen-mount-probe"), "1m"), reason="no tmpfs can be mounted here")
def test_resuming_on_a_read_only_file_system_is_a_clear_error(tmp_path, cache_dir, reference):
    _umount(Path("/tmp/.recurlen-mount-probe"))
    mount = tmp_path / "ro"
    assert _mount_tmpfs(mount, "20m")
    try:
        subprocess.run(["cp", "-a", str(reference), str(mount / "run")], check=True)
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        proc = run(args(mount / "run", cache_dir, steps=STEPS + 10))
        _one_line_error(proc, f"cannot write {mount / 'run'}/writer.lock: read-only file system")
    finally:
        _umount(mount)


def test_a_file_size_limit_below_a_checkpoint_is_said_before_anything_is_written(tmp_path, cache_dir, reference):
    import resource

    out = tmp_path / "run"
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    limit = 500 * 1024  # `ulimit -f 500`; a checkpoint of the nano run is ~0.9 MB
    proc = subprocess.run(args(out, cache_dir), cwd=REPO, env=env(), capture_output=True, text=True, timeout=600,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard)))
    _one_line_error(proc, "a checkpoint of nano takes about 0.", "file-size limit (ulimit -f 500", "-f unlimited")
    assert not out.exists()


def _one_line_error(proc, *needles):
    """Exit 2 with a single `recurlen finetune: error: ...` line holding every needle, and no traceback."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "recurlen finetune: error:" in line]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])
    return errors[0]


def _damage(path, how):
    stamp = path.stat().st_mtime
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 3])
    else:  # one flipped bit in the tensor data: torch.load alone would not notice
        flipped = bytearray(data)
        flipped[len(data) // 2] ^= 0x04
        path.write_bytes(bytes(flipped))
    os.utime(path, (stamp + 60, stamp + 60))  # still the newest file


@pytest.mark.parametrize("how", ["truncated", "bit-flip"])
def test_damaged_last_ckpt_is_moved_aside_and_the_run_resumes_identically(tmp_path, cache_dir, reference, how):
    out = tmp_path / "run"
    every = ("trainer.checkpoint_every_n_steps=10",)
    # The third write of last.ckpt (step 30) is killed: step=000030.ckpt was written just before it.
    proc = run(args(out, cache_dir, *every), RECURLEN_FAULT="point=start,file=last.ckpt,skip=2,action=kill")
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    last = RunDir(out).last_checkpoint
    _damage(last, how)
    again = run(args(out, cache_dir, *every))
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resuming from {out / 'checkpoints' / 'step=000030.ckpt'} (step 30)" in again.stderr
    warned = [line for line in again.stderr.splitlines() if "moved aside" in line]
    if how == "truncated":  # no step can be read from it: examined first, found damaged, kept under another name
        assert len(warned) == 1 and str(last) in warned[0] and "last.ckpt.damaged" in warned[0], again.stderr[-3000:]
        assert (out / "checkpoints" / "last.ckpt.damaged").is_file()  # kept, never deleted
    else:  # it still says step 20 (the killed write was step 30's): step=000030.ckpt is further, last.ckpt not needed
        assert warned == [], again.stderr[-3000:]
    assert_same_run(out, reference)


def test_rerun_with_changed_settings_is_refused_or_applied(tmp_path, cache_dir, reference):
    from omegaconf import OmegaConf
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    subprocess.run(["cp", "-a", str(reference), str(out)], check=True)
    config = (out / "config.yaml").read_text()
    for override, named in (("data.batch_size=4", "data.batch_size 2 -> 4"),
                            ("intervention=fitted_noise", "intervention.name state_passing -> fitted_noise"),
                            ("model=tiny", "fixed settings differ from those asked for: model.arch.d_model 64 -> 128")):
        _one_line_error(run(args(out, cache_dir, override)), named, "another run_dir", "resume=archive")
        assert (out / "config.yaml").read_text() == config  # nothing rewritten by a refused rerun
    _one_line_error(run(args(out, cache_dir, "resume=never")), "already holds a run", "resume=archive")
    # Changeable: more steps at a lower rate continue the finished run, and the new rate is the one used.
    proc = run(args(out, cache_dir, "optim.lr=5e-4", steps=STEPS + 10))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"with changed settings: optim.lr 0.001 -> 0.0005; trainer.max_steps {STEPS} -> {STEPS + 10}" in proc.stderr
    assert weights(out)[0] == STEPS + 10
    assert OmegaConf.load(out / "config.yaml").optim.lr == 5e-4
    history = OmegaConf.to_container(OmegaConf.load(out / "config_history.yaml"))
    assert history[-1]["changed"]["optim.lr"] == {"from": 1e-3, "to": 5e-4}
    acc = EventAccumulator(str(out / "tb"))
    acc.Reload()
    lrs = {e.step: e.value for e in acc.Scalars("train/lr")}
    assert max(v for s, v in lrs.items() if s >= STEPS) == pytest.approx(5e-4) and lrs[STEPS - 10] > 5e-4


@pytest.mark.parametrize("to", ["stage", "demo"])
def test_sigterm_to_a_demo_stage_is_not_marked_done_and_the_rerun_continues(tmp_path, to):
    """SIGTERM to the stage process (what a scheduler's kill of it does), or to the demo, which passes it on."""
    import json

    root, cache = tmp_path / "demo", tmp_path / "cache"
    cmd = [sys.executable, "-m", "recurlen", "demo", f"run_root={root}", "pretrain_steps=300",
           "posttrain_steps=2", "interventions=[none]", "eval.effrem=false", "eval.length=128",
           "eval.num_sequences=2", "eval.chunk_len=64", "eval.batch_size=2",
           "overrides=[data.max_documents=60,data.val_length=128,data.val_sequences=2,data.batch_size=8,"
           "trainer.val_every_n_steps=1000,trainer.checkpoint_every_n_steps=1000,trainer.limit_val_batches=1]"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env(RECURLEN_CACHE=str(cache)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:  # a failed assertion must not leave the demo running with nobody reading its pipes
        log, deadline = root / "pretrain" / "train.log", time.time() + 300
        while not (log.is_file() and "writes a checkpoint after the current step" in log.read_text()):
            assert proc.poll() is None and time.time() < deadline, "the pre-training stage never started training"
            time.sleep(0.1)
        stage = _children(proc.pid)
        assert stage, "no stage process"
        os.kill(stage[0] if to == "stage" else proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            for pid in [*_children(proc.pid), proc.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 143, err[-3000:]
    assert "recurlen demo: interrupted by SIGTERM after step" in err and "Traceback" not in err, err[-3000:]
    step = weights(root / "pretrain")[0]
    assert 0 < step < 300
    assert not (root / "pretrain" / "stage_done.json").exists()
    assert not (root / "post").exists() and not (root / "report.md").exists()
    if to == "demo":
        return
    again = subprocess.run(cmd, cwd=REPO, env=env(RECURLEN_CACHE=str(cache)), capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert weights(root / "pretrain")[0] == 300
    assert json.loads((root / "pretrain" / "stage_done.json").read_text())["global_step"] == 300
    report = (root / "report.md").read_text()
    assert "pre-trained for 300 steps" in report and "| pretrain | 300 |" in report


def test_fitted_noise_file_with_the_wrong_shape_is_a_clear_error(tmp_path, cache_dir):
    from recurlen.training.interventions import FittedNoiseStats

    bad = tmp_path / "noise.pt"
    FittedNoiseStats(torch.zeros(5, 8), torch.ones(5, 8)).save(str(bad))
    out = tmp_path / "run"
    proc = run(args(out, cache_dir, "intervention=fitted_noise", f"intervention.fit_stats={bad}"))
    _one_line_error(proc, str(bad), "shape (5, 8)", "needs (2, 8)")
    assert not out.exists()


def test_nan_on_one_ddp_rank_stops_every_rank(tmp_path, cache_dir):
    """A NaN loss on rank 1 only: both ranks stop at that step with the one-line error (none is left waiting in
    the gradient all-reduce), and nothing of that step is saved."""
    out = tmp_path / "run"
    ddp = ("trainer.devices=2", "trainer.strategy=ddp", "trainer.checkpoint_every_n_steps=10")
    proc = run(args(out, cache_dir, *ddp), MASTER_PORT=free_port(),
               RECURLEN_FAULT="point=step,step=15,action=nan,what=loss,rank=1")
    _one_line_error(proc, "non-finite training loss (nan) at global step 15",
                    f"the newest checkpoint from before it is {RunDir(out).checkpoints / 'step=000010.ckpt'} (step 10)")
    assert weights(out)[0] == 10


def test_nan_at_a_step_stops_before_it_is_saved_and_a_lower_lr_resumes(tmp_path, cache_dir):
    out = tmp_path / "run"
    every = ("trainer.checkpoint_every_n_steps=10",)
    proc = run(args(out, cache_dir, *every), RECURLEN_FAULT="point=step,step=25,action=nan,what=grad")
    step20 = RunDir(out).checkpoints / "step=000020.ckpt"
    _one_line_error(proc, "non-finite gradient of backbone.layers.0.", "(layer 0) at global step 25",
                    f"the newest checkpoint from before it is {step20} (step 20)", "optim.lr=0.00025",
                    f"optim.lr=0.00025 resume={step20}")
    assert weights(out)[0] == 20 and sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "last.ckpt", "step=000010.ckpt", "step=000020.ckpt"]
    again = run(args(out, cache_dir, *every, "optim.lr=0.00025", f"resume={step20}"))  # the message's advice
    assert again.returncode == 0, again.stderr[-3000:]
    step, state = weights(out)
    assert step == STEPS and all(torch.isfinite(v).all() for v in state.values())
