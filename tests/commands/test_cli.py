"""The command layer: one table, --help from the dataclasses, validation before work, user errors in one line."""

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from recurlen.commands import cli
from recurlen.models import table
from recurlen.util.arguments import _sections, field_docs
from recurlen.util.errors import UserError, user_input


def run(capsys, *argv):
    rc = cli.main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_every_command_has_help(capsys, name):
    rc, out, err = run(capsys, name, "--help")
    assert rc == 0 and err == ""
    assert out.startswith(f"usage: recurlen {name}") and "--dry-run" in out


def test_experiment_help_lists_groups_choices_and_fields_with_type_value_and_meaning(capsys):
    rc, out, _ = run(capsys, "finetune", "model=780m", "--help")
    assert rc == 0
    # Every row of the model table and every preset file under experiments/model/, sorted, the composed one named.
    presets = {p.stem for p in (Path(__file__).parents[2] / "experiments" / "model").rglob("*.yaml")}
    assert {"780m", "tiny-slow", "rwkv6-7b"} <= presets | set(table.names())
    assert f"model         {' | '.join(sorted({*table.names(), *presets}))}   (here: 780m)" in out
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("trainer.max_steps "))
    assert "int = 500" in line and "Optimizer steps" in line
    assert "model.pretrained    str | None = state-spaces/mamba2-780m" in out  # the composed value, not the default
    rc, out, _ = run(capsys, "eval", "--help")
    assert "seq_len" in out and "L, tokens per held-out sequence" in out and "data=GROUP" in out


def test_every_settings_field_has_a_meaning():
    from recurlen.commands.demo import DemoConfig
    from recurlen.commands.export import ExportSettings
    from recurlen.evaluation.generation import GenerateConfig
    from recurlen.evaluation.runner import EvalConfig
    from recurlen.training.experiments.schema import ExperimentConfig

    missing = []

    def walk(cls):
        docs, sections = field_docs(cls), _sections(cls)
        missing.extend(f"{cls.__name__}.{f.name}" for f in dataclasses.fields(cls)
                       if f.name not in docs and f.name not in sections)
        for sub in sections.values():
            walk(sub)

    for cls in (ExperimentConfig, DemoConfig, EvalConfig, GenerateConfig, cli.ReportSettings, ExportSettings):
        walk(cls)
    assert missing == []


@pytest.mark.parametrize(("argv", "expected"), [
    (["finetune", "trainer.max_step=3"], "unknown key 'trainer.max_step'; did you mean trainer.max_steps"),
    (["finetune", "model=780mm"], "unknown model '780mm'; did you mean 780m"),
    (["config", "experiment=finetun"], "unknown experiment 'finetun'; did you mean finetune"),
    (["demo", "eval.lenght=3"], "unknown demo setting 'eval.lenght'; did you mean eval.length"),
    (["finetune", "--outt", "x"], "unknown option --outt"),
    (["finetune", "trainer.max_steps=0"], "trainer.max_steps must be >= 1; got 0"),
    (["eval", "nowhere/at-all/run"], "checkpoint 'nowhere/at-all/run' does not exist"),
    (["generate", "--checkpoint", "missing.ckpt"], "checkpoint 'missing.ckpt' does not exist"),
    (["generate", "model=mamba1-tiny"], "model='mamba1-tiny' is unknown for architecture=mamba2; allowed: ['1.3b'"),
])
def test_user_errors_print_one_line_without_traceback(capsys, argv, expected):
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and out == ""
    assert err.startswith(f"recurlen {argv[0]}: error: ") and expected in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_an_eval_typo_fails_before_any_model_is_loaded(capsys, tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"not a checkpoint: loading it would fail differently")
    for typo, meant in (("seq_lenn=256", "seq_len=256"), ("num_sequence=4", "num_sequences=4")):
        rc, _, err = run(capsys, "eval", str(run_dir), typo, "--out", str(tmp_path / "out"))
        key, value = typo.split("=")
        # The misspelt setting leads (it said "checkpoint '4' does not exist" first).
        assert rc == 2 and err.startswith(f"recurlen eval: error: unknown eval setting {key!r}; did you mean "
                                          f"{meant}? (`--help` lists them all); read as LABEL=PATH instead, "
                                          f"checkpoint {value!r} does not exist"), err
    assert not (tmp_path / "out").exists()


def test_eval_help_says_the_held_out_length_the_command_takes(capsys, tmp_path, experiment, cli_logs):
    from recurlen.training.finetune import run_finetune

    rc, out, _ = run(capsys, "eval", "--help")
    line = " ".join(next(ln for ln in out.splitlines() if ln.strip().startswith("seq_len ")).split())
    # It said "None: 131072 on CUDA, 16 x train_len on CPU"; the command takes the data's val_length (the demo's 32T).
    assert rc == 0 and "None: the held-out data's data.val_length, else 16 x its data.seq_len" in line, line
    run_dir = run_finetune(experiment(tmp_path / "run", "data.val_length=96"))
    rc, out, err = run(capsys, "eval", str(run_dir), "--dry-run")
    assert rc == 0 and "8 sequences of 96 tokens" in out, out + err


def test_eval_takes_one_bare_value_of_a_list_setting_as_a_list(capsys, tmp_path):
    # omegaconf refused it: "Invalid value assigned: AnyNode is not a ListConfig ..."
    rc, out, err = run(capsys, "eval", "state-spaces/mamba2-780m", "tasks=positionwise", "fixes=forget_more",
                       "fix.forget_more.memory=2", "--out", str(tmp_path), "--dry-run")
    assert rc == 0, err
    assert "  tasks          positionwise\n" in out and "fixes on mamba2-780m forget_more (forget_more: " in out, out


def test_eval_takes_options_and_settings_in_any_order(capsys, tmp_path):
    rc, out, err = run(capsys, "eval", "--out", str(tmp_path), "state-spaces/mamba2-780m", "seq_len=4096",
                       "data=pg19", "num_sequences=2", "--dry-run", "data.max_documents=10")
    assert rc == 0, err
    assert "2 sequences of 4096 tokens" in out and "first 10 documents" in out and f"output         {tmp_path}" in out


def test_debug_shows_the_traceback_and_bugs_keep_theirs(capsys, monkeypatch):
    with pytest.raises(UserError, match="trainer.max_step"):
        cli.main(["finetune", "trainer.max_step=3", "--debug"])
    monkeypatch.setenv("RECURLEN_DEBUG", "1")
    with pytest.raises(UserError):
        cli.main(["finetune", "trainer.max_step=3"])
    monkeypatch.delenv("RECURLEN_DEBUG")

    def buggy(words):  # a ValueError outside validation is a bug, not the user's to fix
        return int("not a number")

    monkeypatch.setitem(cli.COMMANDS, "finetune", dataclasses.replace(cli.COMMANDS["finetune"], run=buggy))
    with pytest.raises(ValueError, match="invalid literal"):
        cli.main(["finetune"])


def test_user_input_marks_validation_errors_as_the_users():
    with pytest.raises(UserError, match="bad"), user_input():
        raise ValueError("bad")
    with pytest.raises(UserError, match="gone"), user_input():
        raise FileNotFoundError("gone")
    with pytest.raises(KeyError), user_input():
        raise KeyError("a bug")


def test_the_installed_command_prints_user_errors_without_traceback():
    proc = subprocess.run([sys.executable, "-m", "recurlen", "finetune", "optim.lrr=1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("recurlen finetune: error: unknown key 'optim.lrr'")
    assert "Traceback" not in proc.stderr
