"""`recurlen arbiter`: its config and plan, its results.json (everything a verdict rests on, per sequence and per
trial) and, at toy size, the whole pipeline through the command line."""

import json
import subprocess
import sys

import pytest

from recurlen.commands import cli
from recurlen.commands.arbiter import load_arbiter_config
from recurlen.commands.arbiter_stages import cached_entry
from recurlen.diagnostics.intervals import binomial_interval
from recurlen.util.errors import UserError

TOY = ["overrides=[model=nano,trainer.max_steps=2,data.max_documents=60,data.val_fraction=0.2,data.val_sequences=2]",
       "interventions=[none,tbptt]", "fixes=[forget_more]", "judge.length_factors=[1,2]", "judge.trials=2",
       "judge.depths=[1.0]", "judge.num_sequences=2", "parallel=1"]


def test_bad_arbiter_settings_are_one_line_errors():
    with pytest.raises(UserError, match="unknown arbiter setting 'judge.trails'"):
        load_arbiter_config(["judge.trails=3"])
    with pytest.raises(ValueError, match=r"arbiter interventions \['bogus'\] are unknown"):
        load_arbiter_config(["interventions=[none,bogus]"])
    with pytest.raises(ValueError, match=r"arbiter: settings for fixes \['a_scale'\] that are not in"):
        load_arbiter_config(["fixes=[forget_more]", "fix.a_scale.steps=3"])
    cfg = load_arbiter_config(["fixes=[forget_more,fm2=forget_more]", "fix.fm2.memory=2"])
    assert cfg.fixes == ["forget_more", "fm2=forget_more"] and cfg.fix == {"fm2": {"memory": 2}}


def test_a_judged_model_is_reused_only_on_the_same_inputs(tmp_path):
    inputs = {"checkpoint": "runs/arbiter/base/checkpoints/last.ckpt", "checkpoint_mtime_ns": 1,
              "judge": {"trials": 16}, "fix": None, "sequences": "abc"}
    path = tmp_path / "base.json"
    assert cached_entry(path, inputs) is None  # nothing judged yet
    path.write_text(json.dumps({"inputs": inputs, "entry": {"label": "base"}}))
    assert cached_entry(path, dict(inputs)) == {"label": "base"}
    for key, other in (("checkpoint_mtime_ns", 2), ("judge", {"trials": 32}), ("sequences", "abd")):
        assert cached_entry(path, {**inputs, key: other}) is None, key
    path.write_text("{not json")
    assert cached_entry(path, inputs) is None


def test_dry_run_plans_every_stage(tmp_path, capsys):
    assert cli.main(["arbiter", f"run_root={tmp_path}/arb", *TOY, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "1. base         nano, T = 256, 2 steps of 16 rows (8 text, 8 passkey)" in out
    assert "2. post/<name>  none, tbptt: 2 steps each on the same mix" in out
    assert "full - reset on 2 held-out sequences of 512 tokens; passkey at 256, 512 tokens" in out
    assert not (tmp_path / "arb").exists()


@pytest.mark.slow  # ~1.5 min: three trainings in their own processes and four models judged
def test_toy_arbiter_keeps_what_its_verdicts_rest_on(tmp_path):
    root = tmp_path / "arb"
    proc = subprocess.run([sys.executable, "-m", "recurlen", "arbiter", f"run_root={root}", *TOY],
                          capture_output=True, text=True, timeout=600,
                          env={"RECURLEN_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| model | loss [0,T) (cost) | full - reset [T,2T) | loss verdict | passkey T | passkey 2T |" in proc.stdout
    results = json.loads((root / "results.json").read_text())
    entries = results["bases"][0]["entries"]
    assert [(e["label"], e["kind"]) for e in entries] == [("base", "base"), ("none", "post"), ("tbptt", "post"),
                                                          ("base+forget_more", "fix")]
    assert entries[3]["fix"]["name"] == "forget_more" and entries[1]["steps"] == 2
    for e, v in zip(entries, results["verdicts"]):
        # every trial's outcome: the interval the table shows is recomputable from results.json alone
        pooled = {}
        for cell in e["passkey"]["cells"]:
            pooled.setdefault(cell["length"], []).extend(cell["outcomes"])
        for row in v["retrieval"]["by_length"]:
            outcomes = pooled[row["length"]]
            assert row["interval"] == pytest.approx(list(binomial_interval(sum(outcomes), len(outcomes))))
        assert len(e["loss"]["positionwise"]["per_sequence"]["loss"]) == 2
        assert v["verdict"] in ("holds by forgetting", "holds and retrieves", "fails", "undecided",
                                "base does not retrieve")
    assert set(results["stages"]) == {"base", "post", "judge"}
    assert all(s["cpu_seconds"] > 0 and not s["reused"] for s in results["stages"].values())
    for stage in ("base", "post/none", "post/tbptt"):
        assert (root / stage / "checkpoints" / "last.ckpt").is_file() and (root / stage / "train.log").is_file()
    assert (root / "report.md").read_text().startswith("# recurlen arbiter")
    # run again: the trained stages and the judged models are reused, the table is the same
    again = subprocess.run([sys.executable, "-m", "recurlen", "arbiter", f"run_root={root}", *TOY],
                           capture_output=True, text=True, timeout=600,
                           env={"RECURLEN_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"})
    assert again.returncode == 0, again.stderr[-3000:]
    assert "judging 0 models by the loss and by retrieval, 1 at a time (4 judged before on the same inputs" \
        in again.stderr
    rerun = json.loads((root / "results.json").read_text())
    assert rerun["verdicts"] == results["verdicts"]
    assert rerun["stages"]["base"]["reused"] and rerun["stages"]["post"]["reused"]
    assert "base" in (root / "report.md").read_text().split("\n")[2] and "(done before: reused)" in again.stdout


def test_the_experiments_fix_settings_give_way_to_a_command_lines_fixes():
    """experiments/arbiter.yaml sets its own fixes' settings (stuffed_mamba's search): a command line naming other
    fixes drops them, while settings it gives itself for a fix it does not name are still refused."""
    assert "stuffed_mamba" in load_arbiter_config([]).fix
    cfg = load_arbiter_config(["fixes=[forget_more]"])
    assert cfg.fixes == ["forget_more"] and "stuffed_mamba" not in cfg.fix
    with pytest.raises(ValueError, match=r"settings for fixes \['stuffed_mamba'\] that are not in fixes"):
        load_arbiter_config(["fixes=[forget_more]", "fix.stuffed_mamba.search=da_mult"])
