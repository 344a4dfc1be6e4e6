"""`recurlen passkey|niah fixes=[...] fix.KEY.*=...`: the fixes scored on the task's prompts beside the model, end to
end on a tiny run, and in the report."""

from __future__ import annotations

import json

import pytest

from recurlen.commands import cli
from recurlen.commands.report import write_report
from recurlen.training.finetune import run_finetune


@pytest.fixture(scope="module")
def tiny_run(experiment, tmp_path_factory):
    return run_finetune(experiment(tmp_path_factory.mktemp("fixes") / "run"))


def _task(task: str, run_dir, out, *words: str) -> list[str]:
    return [task, f"model.pretrained={run_dir}", "task.train=false", "task.trials=2", "task.eval_batch_size=2",
            f"run_dir={out}", "trainer.num_threads=1", *words]


def test_passkey_with_fixes_scores_each_fix_beside_the_model_and_the_report_shows_them(tiny_run, tmp_path, capsys,
                                                                                          cli_logs, cache_dir):
    out = tmp_path / "pk"
    rc = cli.main(_task("passkey", tiny_run, out, "task.lengths=[256,320]", "task.passkey.depths=[0.5]",
                        f"data.cache_dir={cache_dir}", "fixes=[mambaextend,cap=forget_more]",
                        "fix.mambaextend.steps=1", "fix.mambaextend.sequences=1", "fix.mambaextend.chunk_len=64",
                        "fix.cap.sequences=1", "fix.cap.grid=[1,2]"))
    assert rc == 0, capsys.readouterr().err
    res = json.loads((out / "passkey" / "results.json").read_text())
    base = tiny_run.name
    assert [e["label"] for e in res["fixes"]] == [f"{base}+mambaextend", f"{base}+cap"]
    for entry in res["fixes"]:
        assert entry["lengths"] == [256, 320] and len(entry["cells"]) == 2
        assert set(entry["mean_accuracy_by_length"]) == {"256", "320"}
        cal = entry["fix"]["calibration"]
        # Calibrated at the longest evaluated length (the target) on held-out text after the first task.trials rows.
        assert cal["data"] == {"sequences": 1, "length": 320, "rows": cal["data"]["rows"]}
        assert cal["data"]["rows"].startswith("held-out sequences 2 to 2 of ")
        assert cal["loss_after"] <= cal["loss_before"]
    assert res["fixes"][0]["fix"]["name"] == "mambaextend" and res["fixes"][0]["fix"]["calibration"]["steps"] == 1
    assert res["fixes"][1]["fix"]["name"] == "forget_more" and res["fixes"][1]["fix"]["config"]["grid"] == [1.0, 2.0]
    text = write_report([out / "passkey"], out_dir=tmp_path / "report").read_text()
    assert "## Fixes that need no training, on the tasks" in text
    for entry in [res, *res["fixes"]]:
        label = entry.get("label", base)
        mean = entry["mean_accuracy_by_length"]
        assert f"| {label} | {mean['256']:.2f} | {mean['320']:.2f} |" in text


def test_niah_with_a_fix_given_its_settings_needs_no_calibration(tiny_run, tmp_path, capsys, cli_logs, cache_dir):
    out = tmp_path / "niah"
    rc = cli.main(_task("niah", tiny_run, out, "task.lengths=[320]", "task.niah.tasks=[single_number]",
                        "task.niah.depths=[0.5]", f"data.cache_dir={cache_dir}", "fixes=[forget_more]",
                        "fix.forget_more.memory=2"))
    assert rc == 0, capsys.readouterr().err
    res = json.loads((out / "niah" / "results.json").read_text())
    (entry,) = res["fixes"]
    assert entry["fix"]["calibration"] is None and entry["fix"]["values"]["memory_T"] == 2.0
    assert set(entry["mean_accuracy_by_length"]) == {"320"}


def test_task_fix_arguments_are_checked_as_eval_checks_them(tiny_run, tmp_path, capsys, cli_logs):
    rc = cli.main(_task("passkey", tiny_run, tmp_path / "p", "fixes=[mambaextend,cap=forget_more]",
                        "fix.cap.memory=2", "fix.mambaextend.sequences=3", "--dry-run"))
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("  fixes on "))
    assert rc == 0 and line.startswith("  fixes on the evaluated model: mambaextend (mambaextend: sequences=3,")
    assert "cap (forget_more: " in line and line.endswith("calibrated on 3 held-out sequence(s) of its data after "
                                                          "the first 2")
    rc = cli.main(_task("passkey", tiny_run, tmp_path / "a", "fixes=[mambaextend]", "fix.mambaextend.stepz=1",
                        "--dry-run"))
    assert rc == 2 and "fix mambaextend: " in capsys.readouterr().err
    rc = cli.main(_task("passkey", tiny_run, tmp_path / "b", "fixes=[forget_more]", "fix.a_scale.steps=1",
                        "--dry-run"))
    assert rc == 2 and "settings for fixes ['a_scale'] that are not in fixes=['forget_more']" in \
        capsys.readouterr().err
    rc = cli.main(["copying", "fixes=[forget_more]", "--dry-run"])
    assert rc == 2 and "fixes=[...] is evaluated by the tasks ['passkey', 'niah']" in capsys.readouterr().err


@pytest.mark.parametrize("task", ["niah", "passkey"])
def test_a_non_finite_task_fix_setting_is_one_line(task, tiny_run, tmp_path, capsys, cli_logs):
    rc = cli.main(_task(task, tiny_run, tmp_path / "n", "fixes=[forget_more]", "fix.forget_more.memory=nan"))
    err = capsys.readouterr().err
    assert rc == 2 and "fix.forget_more.memory must be a finite number; got nan" in err, err
    assert not (tmp_path / "n").exists()
