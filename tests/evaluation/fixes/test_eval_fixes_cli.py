"""`recurlen eval fixes=[...] fix.NAME.KEY=VALUE` on a tiny run, end to end."""

from __future__ import annotations

import json

from recurlen.commands import cli
from recurlen.models import registry
from recurlen.training.finetune import run_finetune


def test_the_dry_run_names_each_fix_its_settings_and_the_rows_it_calibrates_on(capsys, tmp_path, cli_logs):
    ckpt = tmp_path / "base"
    registry.get("mamba2").build(registry.get("mamba2").preset("nano")).save_pretrained(str(ckpt))
    rc = cli.main(["eval", f"base={ckpt}", "train_len=32", "num_sequences=3", "fixes=[mambaextend,cap=forget_more]",
                   "fix.cap.memory=2", "fix.mambaextend.sequences=2", "--dry-run"])
    out = capsys.readouterr().out
    assert rc == 0
    line = next(ln for ln in out.splitlines() if ln.startswith("  fixes on base"))
    assert "mambaextend (mambaextend: sequences=2," in line and "cap (forget_more: " in line and "memory=2.0" in line
    assert line.endswith("calibrated on 2 held-out sequence(s) after the 3 scored")


def test_recurlen_eval_with_fixes_on_a_tiny_run_end_to_end(experiment, tmp_path, capsys, cli_logs):
    run_dir = run_finetune(experiment(tmp_path / "run"))
    out = tmp_path / "eval"
    rc = cli.main(["eval", str(run_dir), "seq_len=128", "num_sequences=1", "tasks=[positionwise,reset]",
                   "fixes=[mambaextend,forget_more]", "fix.mambaextend.steps=1", "fix.mambaextend.sequences=1",
                   "fix.forget_more.sequences=1", "fix.forget_more.grid=[1,2]", "progress=false", "log_bins=0",
                   "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 0, err
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert [r["label"] for r in runs] == ["run", "run+mambaextend", "run+forget_more"]
    assert runs[1]["fix"]["config"]["steps"] == 1 and runs[2]["fix"]["config"]["grid"] == [1.0, 2.0]
    rc = cli.main(["eval", str(run_dir), "fixes=[mambaextend]", "fix.mambaextend.stepz=1", "--out", str(out)])
    assert rc == 2 and "fix mambaextend: " in capsys.readouterr().err


def test_non_finite_fix_settings_are_one_line_before_anything_loads(capsys, tmp_path, cli_logs):
    ckpt = tmp_path / "base"
    registry.get("mamba2").build(registry.get("mamba2").preset("nano")).save_pretrained(str(ckpt))
    for words in (["fixes=[forget_more]", "fix.forget_more.memory=nan"],
                  ["fixes=[forget_more]", "fix.forget_more.grid=[nan]"],
                  ["fixes=[mambaextend]", "fix.mambaextend.perturb=nan"],
                  ["fixes=[mambaextend]", "fix.mambaextend.method=backprop", "fix.mambaextend.lr=nan"]):
        rc = cli.main(["eval", f"base={ckpt}", "train_len=32", *words, "--out", str(tmp_path / "out")])
        err = capsys.readouterr().err
        key = words[-1].split("=")[0]
        assert rc == 2 and f"{key}" in err and "must be a finite number; got nan" in err, err
        assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()
