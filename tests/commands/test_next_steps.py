"""The README's next steps after a demo: `make finetune MODEL=tiny` and `make eval` use the demo that finished (the
full one first, else the quick one) and say which; a dry run refuses a run directory the run would refuse."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from recurlen.commands.preflight import experiment_plan
from recurlen.training.finetune import run_finetune
from recurlen.util.errors import UserError

ROOT = Path(__file__).resolve().parents[2]


def plant(root: Path, *, finished: bool = True) -> None:
    """A demo's layout as far as the Makefile looks: its base checkpoint, and report.md once it finished."""
    (root / "pretrain" / "checkpoints").mkdir(parents=True)
    (root / "pretrain" / "checkpoints" / "last.ckpt").write_bytes(b"planted")
    if finished:
        (root / "report.md").write_text("# planted\n")


def make(tmp_path: Path, *words: str, dry: bool = True) -> subprocess.CompletedProcess:
    roots = f"DEMO_ROOTS={tmp_path / 'runs' / 'demo'} {tmp_path / 'runs' / 'demo-quick'}"
    # -o: the install stamp counts as current (an edited pyproject.toml would reinstall the venv otherwise).
    cmd = ["make", *(["-n"] if dry else ["-s"]), "-o", ".venv/.installed", *words, roots]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)


def recurlen_line(out: str) -> list[str]:
    line = next(ln for ln in out.splitlines() if " -m recurlen " in ln)
    return shlex.split(line)[3:]


def test_finetune_and_eval_use_the_quick_demo_when_it_is_the_one_that_ran(tmp_path):
    plant(tmp_path / "runs" / "demo-quick")
    out = make(tmp_path, "finetune", "MODEL=tiny").stdout
    base = tmp_path / "runs" / "demo-quick" / "pretrain" / "checkpoints" / "last.ckpt"
    assert f"post-training the {tmp_path / 'runs' / 'demo-quick'} demo's pre-trained base {base}" in out
    assert recurlen_line(out) == ["finetune", "experiment=demo-posttrain", f"model.pretrained={base}",
                                  "run_dir=runs/finetune/tiny-demo-quick-tbptt", "intervention=tbptt"]
    out = make(tmp_path, "eval").stdout
    quick = tmp_path / "runs" / "demo-quick"
    # The base is labelled "base", as in the demo's own report (it was "pretrain", its directory's name).
    assert recurlen_line(out)[:5] == ["eval", f"base={quick}/pretrain", f"{quick}/post/none",
                                      f"{quick}/post/state_passing", f"{quick}/post/tbptt"]
    # Its first line says whose runs these are: not the run `make finetune` just trained.
    first = make(tmp_path, "eval", "ARGS=--dry-run", dry=False).stdout.splitlines()[0]
    assert first.startswith(f"make eval: no RUNS= given: this evaluates the {quick} demo's runs and not a run you "
                            "post-trained (make eval RUNS=<its run directory> evaluates that one): "), first


def test_the_full_demo_comes_first_and_a_stopped_one_is_not_used(tmp_path):
    plant(tmp_path / "runs" / "demo-quick")
    plant(tmp_path / "runs" / "demo", finished=False)  # stopped during its stages: no report.md
    assert "tiny-demo-quick-tbptt" in " ".join(recurlen_line(make(tmp_path, "finetune", "MODEL=tiny").stdout))
    (tmp_path / "runs" / "demo" / "report.md").write_text("# planted\n")
    out = make(tmp_path, "finetune", "MODEL=tiny").stdout
    full = tmp_path / "runs" / "demo"
    assert f"model.pretrained={full}/pretrain/checkpoints/last.ckpt" in recurlen_line(out)
    assert "run_dir=runs/finetune/tiny-demo-tbptt" in recurlen_line(out)
    assert f"(the full demo's first; {tmp_path / 'runs' / 'demo-quick'} is not used)" in out
    assert recurlen_line(make(tmp_path, "eval").stdout)[1] == f"base={full}/pretrain"


def test_without_a_demo_finetune_trains_from_scratch_and_eval_says_what_to_run(tmp_path):
    out = make(tmp_path, "finetune", "MODEL=tiny").stdout
    assert "no finished demo yet" in out and recurlen_line(out) == ["finetune", "model=tiny", "intervention=tbptt"]
    proc = make(tmp_path, "eval", dry=False)
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[0] == ("make eval: no demo runs to evaluate (make demo writes runs/demo, make demo "
                                           "QUICK=1 runs/demo-quick); run one, or name runs with RUNS='dir dir ...'")


def test_the_dry_run_refuses_a_run_directory_that_holds_another_model(tmp_path, experiment):
    """`make finetune MODEL=tiny` from scratch, then after a demo from its base into the same directory: the run
    refuses it (another model); its dry run said "everything resolved"."""
    run_finetune(experiment(tmp_path / "run", "trainer.max_steps=1"))
    other = experiment(tmp_path / "run", "trainer.max_steps=2", arch="mamba1")
    with pytest.raises(UserError) as dry:
        experiment_plan(other, command="finetune")
    assert str(dry.value).startswith(f"{tmp_path / 'run'} holds a run whose fixed settings differ from those asked "
                                     "for: ")
    assert "model.architecture mamba2 -> mamba1" in str(dry.value)
    assert "choose another run_dir or add resume=archive" in str(dry.value)
    with pytest.raises(UserError) as run:
        run_finetune(other)
    assert "mamba2 model, this run builds a mamba1 model" in str(run.value)
    assert "choose another run_dir or add resume=archive" in str(run.value)
    # The same settings again (a changeable one changed): the plan resumes, as the run does.
    same = experiment(tmp_path / "run", "trainer.max_steps=2")
    assert "resumes from the furthest-trained intact checkpoint" in "\n".join(experiment_plan(same,
                                                                                             command="finetune"))
