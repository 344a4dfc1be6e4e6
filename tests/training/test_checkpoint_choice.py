"""Which checkpoint of a run directory is used: a checkpoint of another model put among a run's own is refused (not
skipped, then replaced), and `recurlen eval RUN` with a damaged last.ckpt uses the intact checkpoint of the same step,
chosen by the resume's own checks, without moving anything."""

import hashlib
import json
import logging
import logging.handlers
import os
import shutil
import time

import pytest

from recurlen.commands import cli
from recurlen.training.experiments.compose import resolved_config
from recurlen.training.finetune import build_model, run_finetune
from recurlen.training.resume import checkpoint_to_read, decide
from recurlen.training.run_dir import RunDir
from recurlen.util.errors import UserError

RUN = ("intervention=state_passing", "data.batch_size=2", "data.val_segments=4", "data.max_documents=40",
       "trainer.max_steps=4", "trainer.checkpoint_every_n_steps=2", "optim.warmup_steps=0", "optim.schedule=constant")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, experiment):
    """A finished 4-step Mamba-2 run (step=000002.ckpt, step=000004.ckpt, last.ckpt) and a Mamba-1 one."""
    base = tmp_path_factory.mktemp("choice")
    run_finetune(experiment(base / "mamba2", *RUN))
    run_finetune(experiment(base / "mamba1", *RUN, arch="mamba1"))
    return base


@pytest.fixture
def run_copy(tmp_path, trained):
    out = tmp_path / "run"
    shutil.copytree(trained / "mamba2", out)
    now = time.time()
    for i, name in enumerate(["step=000002.ckpt", "step=000004.ckpt", "last.ckpt"]):
        os.utime(out / "checkpoints" / name, (now + i, now + i))
    return out


def _digests(path):
    return {p.relative_to(path): hashlib.md5(p.read_bytes()).hexdigest() for p in sorted(path.rglob("*"))
            if p.is_file()}


def _damage(path, how):
    stamp = path.stat().st_mtime
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 3])
    else:  # a flipped bit in the tensor data: it still says its step, its checksum fails
        flipped = bytearray(data)
        flipped[len(data) // 2] ^= 0x10
        path.write_bytes(bytes(flipped))
    os.utime(path, (stamp, stamp))


@pytest.mark.parametrize("max_steps", [4, 6], ids=["finished", "more-steps"])
def test_a_checkpoint_of_another_architecture_among_the_runs_own_is_refused(run_copy, trained, experiment,
                                                                              max_steps):
    """docs/fault-cases.md #36: a Mamba-1 last.ckpt put in a finished Mamba-2 run. Its step (4) equals the run's
    and its file time is older, so the run's step=000004.ckpt came first: 'nothing to train', or, with more steps,
    a resume whose next last.ckpt replaced the planted file without a word."""
    planted = run_copy / "checkpoints" / "last.ckpt"
    shutil.copy2(trained / "mamba1" / "checkpoints" / "last.ckpt", planted)
    os.utime(planted, (1, 1))
    before = _digests(run_copy)
    cfg = experiment(run_copy, *RUN, f"trainer.max_steps={max_steps}")
    with pytest.raises(UserError) as caught:
        decide(RunDir(run_copy), "auto", resolved_config(cfg), build_model(cfg), max_steps=max_steps)
    message = str(caught.value)
    assert message.startswith(f"{planted} holds a mamba1 model, this run builds a mamba2 model, while its other "
                              "checkpoints hold this run's model"), message
    assert f"move it out of {planted.parent}" in message and "resume=archive" in message, message
    assert _digests(run_copy) == before


def test_a_changed_model_keeps_its_line(run_copy, experiment):
    """Every checkpoint of another model: the model asked for changed (#44's line, not the planted-file one)."""
    cfg = experiment(run_copy, *RUN, "model=tiny")
    with pytest.raises(UserError, match=r"last.ckpt holds another model \(d_model 64 -> 128.*: the model is fixed "
                                        r"for a run; to start a new run instead"):
        decide(RunDir(run_copy), "auto", resolved_config(cfg), build_model(cfg), max_steps=4)


@pytest.mark.parametrize("how", ["truncated", "bit-flip"])
def test_eval_of_a_run_whose_last_ckpt_is_damaged_uses_the_intact_checkpoint_of_the_same_step(
        run_copy, tmp_path, how):
    run = RunDir(run_copy)
    _damage(run.last_checkpoint, how)
    before = _digests(run_copy)
    assert checkpoint_to_read(run) == run.checkpoints / "step=000004.ckpt"
    out = tmp_path / "eval"
    records = logging.handlers.BufferingHandler(100)  # on the logger itself: the command line stops propagation
    logging.getLogger("recurlen.training.resume").addHandler(records)
    try:
        assert cli.main(["eval", str(run_copy), "seq_len=64", "num_sequences=2", "tasks=[positionwise]",
                         "progress=false", "--out", str(out)]) == 0
    finally:
        logging.getLogger("recurlen.training.resume").removeHandler(records)
    warned = [r.getMessage() for r in records.buffer if r.levelno == logging.WARNING]
    assert len(warned) == 1 and str(run.last_checkpoint) in warned[0], warned
    assert "evaluating step=000004.ckpt instead, the intact checkpoint of the same step (4" in warned[0], warned
    assert json.loads((out / "results.json").read_text())["runs"][0]["source"] == str(
        run.checkpoints / "step=000004.ckpt")
    assert _digests(run_copy) == before  # a reader moves nothing aside


def test_eval_refuses_an_earlier_checkpoint_for_a_damaged_last_one(run_copy, tmp_path, capsys, cli_logs):
    run = RunDir(run_copy)
    _damage(run.last_checkpoint, "truncated")
    _damage(run.checkpoints / "step=000004.ckpt", "truncated")
    with pytest.raises(UserError, match=r"last.ckpt is not a complete checkpoint file .*, and the furthest intact "
                                        r"checkpoint, .*step=000002.ckpt, holds step 2, not the run's last "
                                        r"\(trainer.max_steps=4\).*recurlen eval .*step=000002.ckpt"):
        checkpoint_to_read(run)
    assert cli.main(["eval", str(run_copy), "seq_len=64", "num_sequences=2", "--out", str(tmp_path / "e")]) == 2
    assert not (tmp_path / "e").exists()
