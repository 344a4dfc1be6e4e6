"""`recurlen passkey | niah` inputs that the task cannot evaluate: one line (exit 2, no traceback) before anything is
trained or written."""

from __future__ import annotations

import pytest

from recurlen.commands import cli
from recurlen.models import registry

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


def test_prompts_too_long_for_the_memory_are_one_line_before_anything_is_written(tmp_path, cache_dir, capsys,
                                                                                 monkeypatch):
    from recurlen.training import memory

    # NIAH at 10^9 tokens was killed by the system at 22 GB after 70 s, leaving writer.json / writer.lock behind.
    # Here 0.75 GiB is all there is, whatever this machine has, and 4M tokens do not fit in it: without the refusal
    # this test evaluates them (minutes, ~0.5 GB), it does not take the machine's memory.
    monkeypatch.setattr(memory, "available_bytes", lambda device: 3 * memory.GIB // 4)
    run = tmp_path / "run"
    line = one_line(capsys, _task("niah", run, cache_dir, "task.lengths=[4000000]"))
    assert "niah at 4000000 tokens, 2 trials in batches of 2: about " in line, line
    assert "but 0.75 GiB of CPU memory is available; lower task.lengths (up to about " in line, line
    assert line.endswith("tokens fit), task.trials or task.eval_batch_size"), line
    assert not run.exists()


def test_the_dry_run_plans_what_the_task_runs(tmp_path, cache_dir, capsys, monkeypatch):
    """task.train=false trains nothing: the plan said "training 400 steps" and the training's memory "fits"."""
    from recurlen.training import memory

    monkeypatch.setattr(memory, "available_bytes", lambda device: 16 * memory.GIB)
    model = tmp_path / "model"
    registry.get("mamba2").build(registry.get("mamba2").preset("nano")).save_pretrained(str(model))
    argv = _task("niah", tmp_path / "run", cache_dir, "task.train=false", f"model.pretrained={model}",
                 "task.lengths=[1000000000]", "--dry-run")
    assert cli.main(argv) == 0
    plan = capsys.readouterr().out
    assert f"  training     none (task.train=false): the task evaluates {model} as it is" in plan, plan
    assert "steps, lr" not in plan and "  memory       " not in plan, plan
    assert "  task memory  niah at 1000000000 tokens" in plan and "does NOT fit" in plan, plan
    assert "on this machine the run would be refused:\n  - niah at 1000000000 tokens" in plan, plan
    trains = _task("niah", tmp_path / "run2", cache_dir, "task.lengths=[512]", "--dry-run")
    assert cli.main(trains) == 0
    plan = capsys.readouterr().out
    assert "  training     1 steps, lr " in plan and "  memory       " in plan and "task memory  niah at 512" in plan


def test_run_task_refuses_what_does_not_fit_before_it_trains(tmp_path, cache_dir, monkeypatch):
    from recurlen.evaluation.tasks.config import load_task_experiment
    from recurlen.evaluation.tasks.runner import run_task
    from recurlen.training import memory
    from recurlen.util.errors import UserError

    monkeypatch.setattr(memory, "available_bytes", lambda device: 3 * memory.GIB // 4)  # as above
    cfg = load_task_experiment(["experiment=passkey", *_task("passkey", tmp_path / "run", cache_dir,
                                                             "task.lengths=[4000000]")[1:]])
    with pytest.raises(UserError, match=r"passkey at 4000000 tokens, 2 trials in batches of 2: about .* but "
                                        r"0.75 GiB of CPU memory is available"):
        run_task(cfg)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # a real passkey evaluation of a 1M-token prompt (~45 s on one core)
def test_the_estimate_bounds_what_a_long_passkey_evaluation_takes(tmp_path):
    """The peak resident memory a 2-trial, batch-2 evaluation at L = 2^20 adds lies between the prompts' share of
    the estimate and the whole estimate (the prompts and the forward, an upper bound)."""
    script = """
import resource, sys, torch
torch.set_num_threads(1)
from recurlen.evaluation.tasks import task_memory
from recurlen.evaluation.tasks.config import load_task_experiment
from recurlen.evaluation.tasks.passkey import evaluate_passkey
from recurlen.models import registry
from recurlen.util.tokenizers import load_tokenizer
L = 1 << 20
cfg = load_task_experiment(["experiment=passkey", "model=nano", "task.trials=2", "task.eval_batch_size=2",
                            f"task.lengths=[{L}]"])
model = registry.get(cfg.model.architecture).build(cfg.model.config, backend="torch").eval()
est = task_memory.for_task(cfg, [L], model=model)
base = int(open("/proc/self/statm").read().split()[1]) * 4096
evaluate_passkey(model, load_tokenizer("bytes"), lengths=[L], depths=[0.5], trials=2, seed=0, batch_size=2,
                 chunk_len=cfg.task.chunk_len, max_new_tokens=1, progress=False)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(peak - base, est.prompts, est.forward)
"""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, check=True)
    grew, prompts, forward = (int(x) for x in out.stdout.split())
    assert 0.5 * prompts < grew < prompts + forward, (grew, prompts, forward)


def test_on_a_gpu_the_prompts_are_checked_against_the_host_and_the_model_against_the_gpu():
    from recurlen.evaluation.tasks.task_memory import TaskMemory
    from recurlen.training.memory import GIB, PROCESS_BYTES

    est = TaskMemory(task="niah", length=10**6, trials=4, batch=4, chunk=2048, per_token=144, weights=GIB,
                     forward=10 * GIB, device="cuda")
    assert est.host == PROCESS_BYTES + 144 * 10**6  # the model is on the GPU
    assert est.device_bytes == GIB + 8 * 4 * 10**6 + 10 * GIB
    assert "at most 11.03 GiB of GPU memory" in est.describe()
    # The forward is an upper bound: refused on the GPU only when the weights and the batch's tokens do not fit.
    assert est.refusal(8 * GIB, 2 * GIB) is None
    assert est.refusal(8 * GIB, GIB).endswith("but 1.00 GiB of GPU memory is available; lower task.lengths, "
                                              "task.trials or task.eval_batch_size")
    assert "but 0.50 GiB of CPU memory is available; lower task.lengths, task" in est.refusal(GIB // 2, 100 * GIB)
