"""One word for what resume=auto picks, the furthest-trained intact checkpoint (by the step it holds, which is what
recurlen.training.resume does), in `--help`, the dry-run plan and the code's messages alike."""

import re
from pathlib import Path

from recurlen.commands.cli import main
from recurlen.commands.preflight import experiment_plan
from recurlen.training.finetune import run_finetune

ROOT = Path(__file__).resolve().parents[2]


def test_help_and_plan_say_furthest_trained(tmp_path, experiment, capsys, cli_logs):
    assert main(["finetune", "--help"]) == 0
    help_text = capsys.readouterr().out
    assert "'auto' continues the run in run_dir from its furthest-trained intact checkpoint" in help_text
    cfg = experiment(tmp_path / "run", "trainer.max_steps=1")
    run_finetune(cfg)
    plan = "\n".join(experiment_plan(cfg, command="finetune"))
    assert (f"resumes from the furthest-trained intact checkpoint: {tmp_path / 'run' / 'checkpoints' / 'last.ckpt'} "
            "(the next one if it is damaged)") in plan


def test_no_message_calls_the_resume_choice_the_newest_checkpoint():
    # "newest" is how the README used to describe a different rule (file time); resume goes by the step.
    wording = re.compile(r"(resumes? from|continues .* from) (its |the )?newest (intact )?checkpoint")
    for path in [ROOT / "recurlen/commands/preflight.py", ROOT / "recurlen/commands/cli.py",
                 ROOT / "recurlen/training/experiments/schema.py", ROOT / "recurlen/training/resume.py",
                 ROOT / "recurlen/util/atomic_files.py"]:
        assert not wording.search(path.read_text()), path
