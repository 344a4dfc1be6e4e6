"""`recurlen passkey | niah` inputs that the task cannot evaluate: one line (exit 2, no traceback) before anything is
trained or written."""

from __future__ import annotations

import pytest

from recurlen.commands import cli

pytestmark = pytest.mark.usefixtures("cli_logs")


def _task(task: str, run_dir, cache_dir, *words: str) -> list[str]:
    """The task on the nano model, one training step if it trains: what fails must fail before that step."""
    return [task, "model=nano", "trainer.max_steps=1", "trainer.val_every_n_steps=0", "trainer.num_threads=1",
            "trainer.progress_bar=false", "task.trials=2", "task.eval_batch_size=2", f"data.cache_dir={cache_dir}",
            f"run_dir={run_dir}", *words]


def one_line(capsys, argv) -> str:
    rc = cli.main([str(a) for a in argv])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert rc == 2 and len(errors) == 1 and "Traceback" not in err, err[-3000:]
    return errors[0]


@pytest.mark.parametrize(("task", "needles"), [
    ("niah", ("niah lengths [8] are too short for the needles and the question of ['multikey', ", "need L >= ",
              "(raise task.lengths, or leave those tasks out of task.niah.tasks)")),
    ("passkey", ("passkey lengths [8] are too short to hold the key and the question; with this tokenizer need L >= ",
                 "(raise task.lengths)")),
])
def test_a_length_below_the_prompt_s_own_size_is_one_line_before_training(tmp_path, cache_dir, capsys, task,
                                                                          needles):
    run = tmp_path / "run"
    line = one_line(capsys, _task(task, run, cache_dir, "task.lengths=[8,100000]"))
    assert all(n in line for n in needles), line
    assert not run.exists()  # nothing trained (it trained first and then raised a ValueError)


def test_a_length_below_the_prompt_s_own_size_is_one_line_without_training(tmp_path, cache_dir, capsys, experiment):
    from recurlen.training.finetune import run_finetune

    model = run_finetune(experiment(tmp_path / "model"))
    line = one_line(capsys, _task("niah", tmp_path / "run", cache_dir, "task.train=false",
                                  f"model.pretrained={model}", "task.lengths=[8]"))
    assert "niah lengths [8] are too short" in line
    assert not (tmp_path / "run" / "niah").exists()
