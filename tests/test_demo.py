"""`make demo` end to end at toy size: every stage runs as a subprocess and every artefact is written."""

import json
import subprocess
import sys

import pytest

from recurlen.demo import load_demo_config

QUICK = ["pretrain_steps=6", "posttrain_steps=3", "interventions=[none,state_passing,tbptt]",
         "overrides=[data.max_documents=60,data.val_length=128,data.val_sequences=2,"
         "trainer.val_every_n_steps=1000,trainer.checkpoint_every_n_steps=1000]",
         "eval.length=256", "eval.num_sequences=4", "eval.effrem_sequences=2", "eval.effrem_points=3",
         "eval.chunk_len=64", "eval.batch_size=4"]


def run_demo_cli(root, cache, *extra):
    cmd = [sys.executable, "-m", "recurlen.cli", "demo", f"run_root={root}", *QUICK, *extra]
    return subprocess.run(cmd, capture_output=True, text=True, env={"RECURLEN_CACHE": str(cache),
                                                                    "PATH": "/usr/bin:/bin"}, timeout=600)


@pytest.mark.slow  # ~3 min: five trainings and the evaluation; CI runs the slow tests
def test_quick_demo_writes_every_artefact_and_reuses_finished_stages(tmp_path):
    root, cache = tmp_path / "demo", tmp_path / "cache"
    proc = run_demo_cli(root, cache)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "# recurlen report" in proc.stdout  # the report is the demo's output

    for name in ["report.md", "results.json", "demo_config.yaml", "loss_by_position.png", "ppl_by_position.png",
                 "full_minus_reset.png", "state_by_position.png", "effrem.png", "eval/results.json"]:
        assert (root / name).is_file() and (root / name).stat().st_size > 0, name
    for stage in ["pretrain", "post/none", "post/state_passing", "post/tbptt"]:
        assert (root / stage / "checkpoints" / "last.ckpt").is_file(), stage
        assert (root / stage / "stage_done.json").is_file(), stage
        assert list((root / stage / "tb").rglob("events.out.tfevents.*")), stage

    results = json.loads((root / "results.json").read_text())
    assert [r["label"] for r in results["runs"]] == ["base", "none", "state_passing", "tbptt"]
    for run in results["runs"]:
        bins = {b["name"]: b for b in run["positionwise"]["bins"]}
        assert list(bins)[:4] == ["[0,T)", "[T,2T)", "[2T,4T)", "[4T,8T)"]  # T = 32, 256 tokens = 8T
        assert bins["[0,T)"]["full_minus_reset"] == 0.0  # nothing to reset inside the first T tokens
        assert all(b["loss"] > 0 for b in bins.values())
        assert run["state"]["ssm_norm"] and run["effrem"]["effrem"]
    # Checks whose bins lie past the evaluated length are left out, never passed by default.
    checks = {c["check"]: c for c in results["checks"]}
    assert not any("[8T,16T)" in name for name in checks), list(checks)
    assert {"state_passing fixes it: full - reset <= +0.05 in every bin up to 8T",
            "tbptt fixes it: full - reset <= +0.05 in every bin up to 8T"} <= set(checks), list(checks)
    assert all(isinstance(c["passed"], bool) and c["value"] is not None for c in checks.values())
    report = (root / "report.md").read_text()
    assert "did NOT fail past T" in report  # the report says why A is initialised as it is
    for section in ["## Setup", "## Verdicts", "## Checks", "## Loss by position", "## Effective Remembrance",
                    "## Stages"]:
        assert section in report, section
    assert {t["stage"] for t in results["timings"]} == {"pretrain", "post/none", "post/state_passing", "post/tbptt"}

    # A second run reuses every finished training stage and only re-evaluates.
    again = run_demo_cli(root, cache)
    assert again.returncode == 0, again.stderr[-3000:]
    timings = json.loads((root / "results.json").read_text())["timings"]
    assert all(t["reused"] for t in timings), timings


def test_bad_demo_config_is_a_clear_error():
    with pytest.raises(ValueError, match=r"demo interventions \['bogus'\] are unknown; allowed"):
        load_demo_config(["interventions=[none,bogus]"])
    with pytest.raises(ValueError, match="unknown demo setting 'no_such_field'"):
        load_demo_config(["no_such_field=1"])
