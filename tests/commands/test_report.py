"""`recurlen report`: verdicts and demo checks on the paired control, and task results read alongside."""

import json
from pathlib import Path

import pytest

from recurlen.commands.demo import demo_checks
from recurlen.commands.report import read_results, run_verdict, write_report

BINS = ["[0,T)", "[T,2T)", "[2T,4T)", "[4T,8T)", "[8T,16T)"]


def run(label, full_minus_reset, loss0=2.0, T=32):
    """A run entry in the results.json format of `recurlen eval`, with the given full - reset per bin."""
    rows, start = [], 0
    for i, (name, fmr) in enumerate(zip(BINS, full_minus_reset)):
        end = T if i == 0 else 2 * start
        loss = loss0 + 0.1 * i + fmr
        rows.append({"name": name, "start": start, "end": end, "kind": "context", "count": 64, "loss": loss,
                     "ppl": 2.718 ** loss, "reset_loss": loss - fmr, "reset_ppl": 2.718 ** (loss - fmr),
                     "full_minus_reset": fmr})
        start = end
    return {"label": label, "train_len": T, "seq_len": 16 * T,
            "positionwise": {"train_len": T, "seq_len": 16 * T, "num_sequences": 4, "bins": rows, "log_bins": []}}


def test_verdicts_read_full_minus_reset():
    assert run_verdict(run("ok", [0, -0.1, 0.0, 0.04, 0.05]))["generalizes"]
    bad = run_verdict(run("bad", [0, 0.0, 0.1, 0.3, 0.9]))
    assert bad["fails"] and not bad["generalizes"] and bad["worst_bin"] == "[8T,16T)"
    assert "FAILS past the training context: full - reset +0.300 in [4T,8T)" in bad["text"]
    middling = run_verdict(run("mid", [0, 0.0, 0.1, 0.2, 0.2]))
    assert not middling["fails"] and not middling["generalizes"] and "mostly holds" in middling["text"]


def test_demo_checks_pass_and_miss_on_their_thresholds():
    runs = [run("base", [0, 0, 0.1, 0.3, 0.9], loss0=2.0), run("none", [0, 0, 0.1, 0.3, 0.8]),
            run("state_passing", [0, 0, 0.0, 0.02, 0.05], loss0=2.15),  # +7.5%: inside 8%
            run("tbptt", [0, 0, 0.0, 0.02, 0.06], loss0=2.2)]  # +0.06 > 0.05 and +10% > 8%
    checks = {c["check"]: c["passed"] for c in demo_checks(runs)}
    assert checks == {
        "baseline fails: full - reset >= +0.3 in [8T,16T)": True,
        "state_passing fixes it: full - reset <= +0.05 in every bin up to 16T": True,
        "state_passing keeps the [0,T) loss within 8% of the baseline's": True,
        "tbptt fixes it: full - reset <= +0.05 in every bin up to 16T": False,
        "tbptt keeps the [0,T) loss within 8% of the baseline's": False,
        "plain fine-tuning (none) still fails: full - reset >= +0.3 in [8T,16T)": True,
    }
    assert demo_checks([run("not-a-base", [0, 0, 0, 0, 0])]) == []  # no base: not a demo, no checks


@pytest.mark.parametrize("fmr", [0.051, 0.2994, 0.2996, 0.3, 0.842])
def test_a_check_that_says_a_run_fails_agrees_with_its_verdict(fmr):
    """+0.051 in [8T,16T) reads "mostly holds" in the verdict, so "plain fine-tuning still fails" misses there; both
    read the value as shown (+0.2996 is +0.300: a failure in both)."""
    runs = [run("base", [0, 0, 0.0, 0.0, fmr]), run("none", [0, 0, 0.0, 0.0, fmr])]
    checks = {c["check"].split(":")[0]: c["passed"] for c in demo_checks(runs)}
    for label, check in (("base", "baseline fails"), ("none", "plain fine-tuning (none) still fails")):
        verdict = run_verdict(next(r for r in runs if r["label"] == label))
        assert checks[check] == verdict["fails"] == (fmr >= 0.2995), (label, fmr, verdict["text"])


def test_report_says_plainly_what_missed(tmp_path):
    results = tmp_path / "eval" / "results.json"
    results.parent.mkdir()
    results.write_text(json.dumps({"format": "recurlen.eval/1", "runs": [
        run("base", [0, 0, 0.1, 0.3, 0.2]), run("tbptt", [0, 0, 0.0, 0.0, 0.0])]}))
    assert "## Checks" not in write_report([results.parent], out_dir=tmp_path / "plain").read_text()
    text = write_report([results.parent], out_dir=tmp_path / "out", checks=demo_checks).read_text()
    assert "| baseline fails: full - reset >= +0.3 in [8T,16T) | +0.200 | - | MISS |" in text
    assert "**2 of 3 checks passed, 1 missed.** Missed: baseline fails" in text
    # Where its numbers come from, against TensorBoard's training-time validation ('val' columns).
    assert "Every number below comes from this evaluation (results.json). TensorBoard's `val` columns" in text
    merged = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [r["label"] for r in merged["runs"]] == ["base", "tbptt"] and merged["tasks"] == []


def test_task_results_are_read_next_to_evaluations(tmp_path):
    passkey = {"format": "recurlen.tasks.passkey/1", "task": "passkey", "model": "runs/passkey/tiny-fitted_noise",
               "train_len": 256, "trials": 4, "lengths": [256, 1024], "depths": [0.1, 0.9],
               "accuracy": [[1.0, 0.25], [0.75, 0.5]], "mean_accuracy_by_length": {"256": 0.875, "1024": 0.375}}
    single = {"char_acc": {"mean": {"8": 1.0, "24": 0.0917}, "std": {"8": 0.0, "24": 0.055}},
              "greedy_char_acc": {"mean": {"8": 0.98, "24": 0.05}, "std": {"8": 0.01, "24": 0.02}}}
    stream = {"char_acc": {"mean": 0.31, "std": 0.04}, "greedy_char_acc": {"mean": 0.2, "std": 0.03}}
    copying = {"format": "recurlen.tasks.copying/2", "task": "copying", "model": "runs/copying/tiny",
               "train_length": 8, "train_seq_len": 18, "headline_length": 24, "chance": 1 / 26, "lengths": [8, 24],
               "readings": {"single": "one example", "stream": "zero-state sequences of >= 4 x T = 72 tokens"},
               "runs": [{"intervention": "none", "seed": 0}],  # a task result, despite its 'runs' key
               "summary": {"none": {"single": single, "stream": stream}}}
    for name, data in (("pk", passkey), ("cp", copying)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(data))
    runs, tasks = read_results([tmp_path / "pk", tmp_path / "cp" / "results.json"])
    assert runs == [] and [t["task"] for t in tasks] == ["passkey", "copying"]
    text = write_report([tmp_path / "pk", tmp_path / "cp"], out_dir=tmp_path / "out").read_text()
    assert "| tiny-fitted_noise (256) | 0.88 | 0.38 |" in text  # mean over depths, by length
    assert "| 0.9 | 0.75 | 0.50 |" in text  # the depth x length grid
    assert "| none char_acc | 1.000 +- 0.000 | 0.092 +- 0.055 |" in text
    assert "| none greedy_char_acc | 0.980 +- 0.010 | 0.050 +- 0.020 |" in text
    assert "| none | 0.310 +- 0.040 | 0.200 +- 0.030 |" in text  # the stream reading, both metrics
    assert "## Verdicts" not in text  # no evaluation runs were given
    # The merged results.json carries the tasks: a report of reports keeps them.
    again = write_report([tmp_path / "out"], out_dir=tmp_path / "again").read_text()
    assert "| tiny-fitted_noise (256) | 0.88 | 0.38 |" in again


def test_bad_results_files_are_clear_errors(tmp_path):
    (tmp_path / "x.json").write_text(json.dumps({"format": "something/1", "rows": []}))
    with pytest.raises(ValueError, match="is not a recurlen results file: neither evaluation runs"):
        read_results([tmp_path / "x.json"])
    (tmp_path / "y.json").write_text(json.dumps({"format": "recurlen.tasks.passkey/1", "task": "passkey"}))
    with pytest.raises(ValueError, match=r"passkey result lacks \['lengths', 'depths', 'accuracy'\]"):
        read_results([tmp_path / "y.json"])
    (tmp_path / "z.json").write_text(json.dumps({"format": "recurlen.tasks.sudoku/1", "task": "sudoku"}))
    with pytest.raises(ValueError, match=r"task='sudoku'; known tasks: \['passkey', 'babilong', 'copying', 'niah'\]"):
        read_results([tmp_path / "z.json"])
    with pytest.raises(FileNotFoundError, match="no results.json"):
        read_results([tmp_path / "missing"])


def test_a_model_that_uses_no_context_is_told_so(tmp_path, nano_model):
    """An untrained model has full - reset ~ 0 everywhere (it ignores its context), which alone reads as
    "length-generalizes". Its loss past T is no better than the held-out tokens' unigram loss: the report
    must say it does not use context."""
    import torch

    from recurlen.evaluation.runner import EvalConfig, run_eval

    nano_model().save_pretrained(str(tmp_path / "untrained"))
    text = (Path(__file__).resolve().parents[2] / "recurlen" / "models" / "mamba2" / "model.py").read_bytes()[:2 * 256]
    seqs = torch.tensor(list(text), dtype=torch.long).view(2, 256)
    cfg = EvalConfig(checkpoints=[f"untrained={tmp_path / 'untrained'}"], output_dir=str(tmp_path / "eval"),
                     train_len=32, seq_len=256, num_sequences=2, tasks=["positionwise", "reset"], chunk_len=64,
                     log_bins=0, device="cpu", progress=False)
    run = run_eval(cfg, seqs)["runs"][0]
    assert run["unigram_loss"] < run["positionwise"]["bins"][1]["loss"]  # no better than ignoring context
    text = write_report([tmp_path / "eval"], out_dir=tmp_path / "out").read_text()
    assert "- untrained: does not use context (loss in [T,2T)" in text
    assert "untrained: length-generalizes" not in text
    without = {k: v for k, v in run.items() if k != "unigram_loss"}  # what the report said before the check
    assert "length-generalizes" in run_verdict(without)["text"]

    uses = {**run, "unigram_loss": 2.0 * run["positionwise"]["bins"][1]["loss"]}  # clearly below: uses context
    assert "does not use context" not in run_verdict(uses)["text"]


def test_state_plot_has_a_log_axis_with_labelled_layers_and_full_minus_reset_starts_at_T():
    from recurlen.diagnostics.plots import plot_full_minus_reset, plot_state

    base = run("base", [0, 0.0, 0.1, 0.3, 0.9])
    positions = [1, 32, 64, 128, 256, 512]
    base["state"] = {"positions": positions, "num_sequences": 4,
                     **{k: [[1.0 + i * p for p in positions] for i in range(3)]
                        for k in ("ssm_norm", "ssm_std", "conv_norm", "conv_std")}}
    fig = plot_state([base])
    for ax in fig.axes:
        assert ax.get_yscale() == "log"
        assert {t.get_text() for t in ax.texts} == {"L0", "L1", "L2"}
    ax = plot_full_minus_reset([base]).axes[0]
    xs = [x for line in ax.get_lines() if line.get_label() == "base" for x in line.get_xdata()]
    assert min(xs) > 32  # the [0,T) bin (0 by construction) is not drawn; the region is shaded instead
    assert any(p.get_label() == "[0,T): full = reset" for p in ax.patches)


def test_checks_and_verdicts_compare_the_value_they_show(tmp_path):
    from recurlen.commands.report import threshold_check

    # +0.0504 is shown as +0.050: "<= +0.05" passes, as a reader checking the row would conclude.
    assert threshold_check("x", 0.0504, "<=", 0.05)["passed"]
    assert not threshold_check("x", 0.0506, "<=", 0.05)["passed"]  # shown +0.051
    assert threshold_check("x", 0.2996, ">=", 0.3)["passed"] and not threshold_check("x", 0.0504, ">", 0.05)["passed"]
    assert threshold_check("x", -0.0804, "abs<=", 0.08)["passed"] and not threshold_check("x", None, "<=", 1)["passed"]
    with pytest.raises(ValueError, match=r"check op '=<' is unknown; allowed: \['<=', '<', '>=', '>', 'abs<='\]"):
        threshold_check("x", 0.0, "=<", 0.05)
    assert run_verdict(run("edge", [0, 0.0, 0.0, 0.0504, 0.05]))["generalizes"]
    assert not run_verdict(run("edge", [0, 0.0, 0.0, 0.0506, 0.05]))["generalizes"]

    results = tmp_path / "eval" / "results.json"
    results.parent.mkdir()
    results.write_text(json.dumps({"format": "recurlen.eval/1", "runs": [run("tbptt", [0, 0, 0.0, 0.0504, 0.0504])]}))

    def checks(runs):
        stale = {**threshold_check("tbptt fixes it: full - reset <= +0.05", 0.0504, "<=", 0.05), "passed": False}
        return [stale, threshold_check("shown +0.051", 0.0506, "<=", 0.05)]

    text = write_report([results.parent], out_dir=tmp_path / "out", checks=checks).read_text()
    # A check that carries op and threshold gets its verdict from the value as shown, whatever it arrived with.
    assert "| tbptt fixes it: full - reset <= +0.05 | +0.050 | - | PASS |" in text
    assert "| shown +0.051 | +0.051 | - | MISS |" in text
    assert "tbptt: length-generalizes up to 16T" in text
