"""One writer per run directory, through the real command: a second `recurlen finetune` on a run directory that a
running one writes is refused at once, naming it, and the running one's checkpoints are untouched; a run killed
with kill -9 leaves its lock, and the rerun takes it over and continues."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import recurlen.training.finetune  # noqa: F401 - imported before the timed refusal, as a command has it by then
from recurlen.commands import cli
from recurlen.util.writer_lock import read_record

pytestmark = pytest.mark.usefixtures("cli_logs")

REPO = Path(__file__).resolve().parents[2]
STEPS = 40


def words(run_dir: Path, cache_dir: str, *extra: str) -> list[str]:
    return ["finetune", "model=nano", "intervention=state_passing", "data.seq_len=16", "data.batch_size=4",
            "data.val_segments=0", "data.val_sequences=0", "data.max_documents=60", f"data.cache_dir={cache_dir}",
            "diagnostics.positionwise=false", "diagnostics.state_norm=false", "trainer.accelerator=cpu",
            "trainer.num_threads=1", "trainer.progress_bar=false", f"trainer.max_steps={STEPS}",
            "trainer.checkpoint_every_n_steps=10", "trainer.val_every_n_steps=0", f"run_dir={run_dir}", *extra]


def start_training(argv: list[str]) -> subprocess.Popen:
    """`recurlen` in another process, returned once it trains (it holds the lock from before it writes)."""
    drop = ("SLURM_", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_", "RANK", "GROUP_RANK", "RECURLEN_FAULT")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    proc = subprocess.Popen([sys.executable, "-m", "recurlen", *argv], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**env, "PYTHONPATH": str(REPO),
                                                                    "OMP_NUM_THREADS": "1"})
    for line in proc.stderr:
        if "writes a checkpoint after the current step" in line:
            return proc
    raise AssertionError(f"the first run never trained: {proc.communicate()}")


def test_a_second_run_is_refused_at_once_and_the_first_run_is_untouched(tmp_path, cache_dir, capsys):
    run = tmp_path / "run"
    # Long enough (a few seconds) to be training still when the second one asks.
    first = start_training(words(run, cache_dir, "optim.lr=1e-4", "trainer.max_steps=100",
                                 "trainer.checkpoint_every_n_steps=25"))
    try:
        started = time.monotonic()
        rc = cli.main(words(run, cache_dir, "optim.lr=3e-3", "trainer.max_steps=30"))
        took = time.monotonic() - started
        err = capsys.readouterr().err
    finally:
        _, first_err = first.communicate(timeout=300)
    assert rc == 2 and took < 2, (took, err)
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in err, err
    assert errors[0].startswith(f"recurlen finetune: error: {run} is being written by another process: pid "
                                f"{first.pid} on this host (")
    assert " since 20" in errors[0] and errors[0].endswith(f"(kill {first.pid}), or choose another run_dir")
    assert first.returncode == 0, first_err[-3000:]
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == ["last.ckpt", *(f"step={s:06d}.ckpt" for s in (25, 50, 75, 100))]
    for name in names:  # every checkpoint is the first run's: its rate, its steps
        ckpt = torch.load(run / "checkpoints" / name, weights_only=True)
        assert set(ckpt["lr_schedulers"][0]["base_lrs"]) == {1e-4}, name
    assert OmegaConf.load(run / "config.yaml").optim.lr == 1e-4
    assert [e["event"] for e in OmegaConf.to_container(OmegaConf.load(run / "config_history.yaml"))] == ["start"]
    assert len(list((run / "tb").rglob("events.out.tfevents*"))) == 1
    assert not (run / "writer.json").exists() and not (run / "writer.lock").exists()


def test_a_run_killed_with_kill_9_leaves_its_lock_and_the_rerun_takes_it_over(tmp_path, cache_dir, caplog):
    run = tmp_path / "run"
    killed = start_training(words(run, cache_dir))
    killed.kill()
    killed.communicate()
    assert read_record(run / "writer.json")["pid"] == killed.pid  # a killed process removes nothing
    log = logging.getLogger("recurlen.util.writer_lock")
    log.addHandler(caplog.handler)  # the command's loggers do not propagate to pytest's
    try:
        assert cli.main(words(run, cache_dir)) == 0
    finally:
        log.removeHandler(caplog.handler)
    assert f"taking over the writer lock of {run} from pid {killed.pid} on this host" in caplog.text
    assert f"pid {killed.pid} no longer runs on this host" in caplog.text
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == STEPS
    assert not (run / "writer.json").exists() and not (run / "writer.lock").exists()


def hold_elsewhere(directory: Path) -> subprocess.Popen:
    """Another process that holds the directory's writer lock until its stdin closes."""
    code = ("import sys; from recurlen.util.writer_lock import WriterLock; WriterLock(sys.argv[1]).acquire(); "
            "print('held', flush=True); sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code, str(directory)], cwd=REPO, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_held_run_directory_is_refused_before_torch_lightning_and_the_config_are_imported(tmp_path, cache_dir):
    """The refusal costs an interpreter start (it came after the imports and the preflight: 7 s at a load of 3)."""
    run = tmp_path / "run"
    holder = hold_elsewhere(run)
    try:
        code = ("import sys; from recurlen.commands import cli; rc = cli.main(sys.argv[1:]); "
                "print(rc, [m for m in ('torch', 'lightning', 'datasets', 'omegaconf') if m in sys.modules])")
        done = subprocess.run([sys.executable, "-c", code, *words(run, cache_dir)], cwd=REPO, capture_output=True,
                              text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    finally:
        holder.communicate(input="")
    assert done.stdout.strip() == "2 []", (done.stdout, done.stderr[-3000:])
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith(f"recurlen finetune: error: {run} is being written by another "
                                                     f"process: pid {holder.pid} on this host ("), done.stderr


def test_a_dry_run_on_a_held_run_directory_names_the_holder(tmp_path, cache_dir, capsys):
    run = tmp_path / "run"
    holder = hold_elsewhere(run)
    try:
        assert cli.main([*words(run, cache_dir), "--dry-run"]) == 0
        assert sorted(os.listdir(run)) == ["writer.json", "writer.lock"]  # the holder's; the dry run wrote nothing
        assert read_record(run / "writer.json")["pid"] == holder.pid
    finally:
        holder.communicate(input="")
    out = capsys.readouterr().out
    held = f"{run} is being written by another process: pid {holder.pid} on this host ("
    assert f"  writer       refused: {held}" in out and "everything resolved" not in out, out
    end = out[out.index("dry run: "):].splitlines()
    assert end[0].endswith("on this machine the run would be refused:") and end[1].startswith(f"  - {held}"), end
