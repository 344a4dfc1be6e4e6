"""An export stands on its own: `recurlen eval DIR` reads the exported run's held-out data (not the embedded group's),
the card's TensorBoard comparison stays out unless asked for, and a run that is still training is exported as the
step it has reached, said in the log, the plan and the card."""

import dataclasses
import json
import logging
import shutil
import subprocess
import sys
import time

import pytest

from recurlen.evaluation.heldout import build_data_config, run_data_config
from recurlen.training.finetune import run_finetune
from recurlen.util.atomic_files import host_name
from tests.commands.export_helpers import run, state_passing_run

pytestmark = pytest.mark.usefixtures("cli_logs")  # each test's log lines land in its own capture

EVAL = ["seq_len=64", "tasks=[positionwise,reset]", "log_bins=0", "batch_size=2", "chunk_len=32", "progress=false"]


@pytest.fixture
def caplog(caplog):
    """pytest's capture, on recurlen's logger itself: once a command set it up, it no longer propagates."""
    logger = logging.getLogger("recurlen")
    logger.addHandler(caplog.handler)
    yield caplog
    logger.removeHandler(caplog.handler)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, experiment):
    """A tiny Mamba-2 post-training run (state passing, 2 steps, T = 16, 60 documents, 20% held out)."""
    return state_passing_run(tmp_path_factory, experiment)


def test_eval_of_an_export_reads_the_run_s_held_out_data(capsys, caplog, tmp_path, run_dir, cache_dir):
    out = tmp_path / "export"
    assert run(capsys, "export", run_dir, "--out", out, "card=false")[0] == 0
    recorded = json.loads((out / "recurlen_export.json").read_text())["data"]
    assert recorded["val_fraction"] == 0.2 and recorded["max_documents"] == 60 and recorded["seq_len"] == 16
    assert "cache_dir" not in recorded  # a path of this machine, not a setting of the data
    # It used to fall back to the embedded group (5% of every document held out, T = 64) and refuse the card's own
    # evaluation settings for want of held-out documents.
    run_data = run_data_config(str(run_dir))
    assert build_data_config(str(out), None, []) == dataclasses.replace(run_data, cache_dir=None)
    rc, plan, err = run(capsys, "eval", out, *EVAL, "num_sequences=6", f"data.cache_dir={cache_dir}", "--dry-run")
    assert rc == 0, err
    assert "first 60 documents" in plan and "T = 16" in plan
    rc, _, err = run(capsys, "eval", out, *EVAL, "num_sequences=6", f"data.cache_dir={cache_dir}",
                     "--out", tmp_path / "eval")
    assert rc == 0, err
    assert "held-out data: the settings of the run" in caplog.text  # said where the held-out data come from
    mine = json.loads((tmp_path / "eval" / "results.json").read_text())["runs"][0]
    rc, _, err = run(capsys, "eval", run_dir, *EVAL, "num_sequences=6", "--out", tmp_path / "eval-run")
    assert rc == 0, err
    theirs = json.loads((tmp_path / "eval-run" / "results.json").read_text())["runs"][0]
    assert mine["positionwise"]["bins"] == theirs["positionwise"]["bins"]  # the same tokens, the same model


def two_run_evaluation(capsys, tmp_path, run_dir, cache_dir):
    rc, _, err = run(capsys, "eval", f"sp={run_dir}", f"again={run_dir}", *EVAL, "num_sequences=2",
                     "--out", tmp_path / "eval")
    assert rc == 0, err
    return tmp_path / "eval"


def test_the_card_s_tensorboard_comparison_is_left_out_unless_asked_for(capsys, tmp_path, run_dir, cache_dir):
    evaluation = two_run_evaluation(capsys, tmp_path, run_dir, cache_dir)
    assert run(capsys, "export", run_dir, "--out", tmp_path / "out", "--eval", evaluation)[0] == 0
    files = json.loads((tmp_path / "out" / "recurlen_export.json").read_text())["files"]
    assert "compare_full_minus_reset.png" in files and not [f for f in files if "events" in f]  # the plot stays
    assert not (tmp_path / "out" / "compare").exists()
    assert run(capsys, "export", run_dir, "--out", tmp_path / "tb", "--eval", evaluation, "tensorboard=true")[0] == 0
    assert list((tmp_path / "tb" / "compare").glob("events.out.tfevents.*"))


@pytest.fixture
def half_run(tmp_path, experiment):
    """A run of 4 steps that has reached step 2: its last.ckpt is the one written at step 2."""
    run_dir = run_finetune(experiment(tmp_path / "half", "intervention=state_passing", "trainer.max_steps=4",
                                      "trainer.checkpoint_every_n_steps=2"))
    shutil.copyfile(run_dir / "checkpoints" / "step=000002.ckpt", run_dir / "checkpoints" / "last.ckpt")
    return run_dir


@pytest.fixture
def live_writer(half_run):
    """Another live process holds the run's writer lock, as a training run does (its writer.json)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    now = time.time()
    (half_run / "writer.json").write_text(json.dumps({"host": host_name(), "pid": proc.pid, "since": "now",
                                                      "heartbeat": now, "command": "recurlen finetune"}))
    yield proc
    proc.kill()
    proc.wait()


def test_a_run_that_is_still_training_is_exported_as_the_step_it_reached_and_says_so(capsys, caplog, tmp_path,
                                                                                      half_run, live_writer):
    rc, plan, err = run(capsys, "export", half_run, "--out", tmp_path / "out", "--dry-run")
    assert rc == 0, err
    assert "step 2 of the run's trainer.max_steps=4: the run is still training" in plan
    rc, _, err = run(capsys, "export", half_run, "--out", tmp_path / "out")
    assert rc == 0, err
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]  # it used to say nothing
    assert any("is still training" in m and "step 2 of trainer.max_steps=4" in m for m in said), said
    card = (tmp_path / "out" / "README.md").read_text()
    assert "2 optimizer steps of 64 tokens" in card and "the run is still training" in card
    commands = card.split("## Reproduce")[1].split("```bash\n")[1].split("```")[0].splitlines()
    assert commands[0].startswith("recurlen finetune ") and "trainer.max_steps=4" in commands[0]
    assert commands[1] == ("# the exported checkpoint is step 2 of the 4 steps the command above trains (the run was "
                           "still training when it was exported)")

    live_writer.kill()  # the run is no longer live: a run that stopped at step 2 is said as such
    live_writer.wait()
    caplog.clear()
    rc, _, err = run(capsys, "export", half_run, "--out", tmp_path / "out")
    assert rc == 0 and "still training" not in caplog.text, err
    assert "(the run stopped there)" in (tmp_path / "out" / "README.md").read_text()
