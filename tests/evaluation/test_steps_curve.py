"""Post-training steps to hold: the curve read from a tiny post-training run's own log, the report's table and plot,
and validation that leaves training untouched (so validating more often cannot change a run's numbers)."""

import json

import pytest
import torch

from recurlen.evaluation.steps_curve import holds, run_curve, steps_curves, steps_lines
from recurlen.training.csv_logger import read_metrics

# T = 16 tokens, held-out sequences of 32T: the far bins [8T,16T) and [16T,32T) exist.
FAR = ("diagnostics.positionwise=true", "data.val_length=512", "data.val_sequences=2", "trainer.log_every_n_steps=1")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, experiment):
    from recurlen.training.finetune import run_finetune

    root = tmp_path_factory.mktemp("steps")
    base = run_finetune(experiment(root / "base", *FAR, "trainer.max_steps=4", "trainer.val_every_n_steps=2"))
    post = run_finetune(experiment(root / "post", *FAR, "trainer.max_steps=6", "trainer.val_every_n_steps=2",
                                   "intervention=state_passing", f"model.pretrained={base}/checkpoints/last.ckpt"))
    return root, base, post


def _logged(run_dir, tag):
    return {int(r["step"]) + 1: r[tag] for r in read_metrics(run_dir / "metrics.csv") if tag in r}


def test_curve_is_the_runs_own_validation_log_with_the_base_at_step_0(runs):
    _, base, post = runs
    c = run_curve("sp", str(post / "checkpoints" / "last.ckpt"))
    assert c["intervention"] == "state_passing" and c["val_every_n_steps"] == 2 and c["pretrain_steps"] == 4
    assert [p["step"] for p in c["points"]] == [0, 2, 4, 6] and c["base_at_step_0"]
    for b, tag in (("[8T,16T)", "val/full_minus_reset@[08T,16T)"), ("[16T,32T)", "val/full_minus_reset@[16T,32T)")):
        logged = _logged(post, tag)
        assert sorted(logged) == [2, 4, 6]  # a row logged at step s is the model after s + 1 steps: the last is 6
        assert [p[b] for p in c["points"][1:]] == [logged[s] for s in (2, 4, 6)]
        assert c["points"][0][b] == _logged(base, tag)[4]  # step 0: the base's validation of its last checkpoint
        # Each value with its 95% interval over the validation's 2 sequences, logged beside it.
        lo, hi = _logged(post, tag.replace("@", "_lo@")), _logged(post, tag.replace("@", "_hi@"))
        for p in c["points"][1:]:
            assert p["intervals"][b] == [lo[p["step"]], hi[p["step"]]]
            assert lo[p["step"]] - 1e-9 <= p[b] <= hi[p["step"]] + 1e-9
    assert c["val_sequences"] == 2
    assert c["posttrain_tokens_per_step"] == 4 * 16 and c["fraction_basis"] == "steps"
    assert steps_curves([{"label": "base", "source": str(base)}]) == []  # not a post-training run: no curve


def test_first_holding_step_reads_values_as_shown_and_its_share_of_pre_training(runs):
    from recurlen.evaluation.steps_curve import _first_steps

    assert holds(0.0504) and not holds(0.0505) and holds(-1.0) and not holds(None) and not holds(float("nan"))
    # With an interval, the upper end decides: a value under the bar whose interval reaches over it does not hold.
    assert not holds(0.01, [-0.05, 0.08]) and holds(0.01, [-0.05, 0.0504])
    pts = [(0, 0.9, 1.5), (100, 0.06, 0.5), (200, 0.0504, 0.2), (300, 0.07, 0.04), (400, 0.01, 0.05)]
    entry = {"points": [{"step": s, "[8T,16T)": a, "[16T,32T)": b} for s, a, b in pts], "fraction_basis": "steps",
             "pretrain_steps": 2000, "pretrain_tokens": 2000 * 64, "posttrain_tokens_per_step": 64}
    out = _first_steps(entry)
    assert out["first_holding_step"] == {"[8T,16T)": 200, "[16T,32T)": 300, "both": 400}
    assert out["holding_from_step"] == {"[8T,16T)": 400, "[16T,32T)": 300, "both": 400}
    assert out["fraction_of_pretraining"]["[8T,16T)"] == pytest.approx(0.1)
    # Runs whose steps hold different token counts compare by tokens: 200 steps of 128 tokens = 20% of 128000.
    tokens = _first_steps({**entry, "fraction_basis": "tokens", "posttrain_tokens_per_step": 128})
    assert tokens["fraction_of_pretraining"]["[8T,16T)"] == pytest.approx(0.2)
    never = _first_steps({**entry, "points": entry["points"][:2]})
    assert never["first_holding_step"]["both"] is None and never["fraction_of_pretraining"]["both"] is None


def test_the_report_plots_and_tables_the_curve(runs, tmp_path):
    from recurlen.commands.report import write_report

    root, base, post = runs
    c = run_curve("sp", str(post))
    bins = [{"name": n, "start": s, "end": e, "kind": "context", "count": 8, "loss": 2.0, "ppl": 7.4,
             "reset_loss": 2.0, "reset_ppl": 7.4, "full_minus_reset": 0.0}
            for n, s, e in (("[0,T)", 0, 16), ("[T,2T)", 16, 32), ("[2T,4T)", 32, 64))]
    entry = {"label": "sp", "source": str(post / "checkpoints" / "last.ckpt"), "train_len": 16, "seq_len": 512,
             "positionwise": {"train_len": 16, "seq_len": 512, "num_sequences": 2, "bins": bins, "log_bins": []}}
    (tmp_path / "results.json").write_text(json.dumps({"format": "recurlen.eval/1", "runs": [entry]}))
    text = write_report([tmp_path / "results.json"], out_dir=tmp_path / "out").read_text()
    assert "## Post-training steps to hold" in text and "![steps to hold](steps_to_hold.png)" in text
    png = tmp_path / "out" / "steps_to_hold.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    for p in c["points"]:
        ci = p["intervals"]["[8T,16T)"]
        assert f"| {p['step']} | {p['[8T,16T)']:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}] | {p['[16T,32T)']:+.3f} [" in text
    assert "Each point is the run's own validation on 2 held-out sequences (data.val_sequences), not the 2 this " \
           "report's verdicts read: its 95% paired-bootstrap interval follows it" in text
    row = next(line for line in text.splitlines() if line.startswith("| sp | every 2 steps | 2 |"))
    first = c["first_holding_step"]["[8T,16T)"]
    assert (f"| {first} ({first / 4:.1%} of pre-training steps) |" in row) if first is not None else "not in 6" in row
    merged = json.loads((tmp_path / "out" / "results.json").read_text())
    assert merged["steps_curve"][0]["points"] == c["points"]
    assert merged["steps_curve"][0]["first_holding_step"] == c["first_holding_step"]
    assert steps_lines([c])[0] == "## Post-training steps to hold"
    # A run that validates only at its end says so; never "validated every ? steps".
    end_only = "\n".join(steps_lines([{**c, "val_every_n_steps": 0}]))
    assert "| sp | at the end only (trainer.val_every_n_steps=0) | 2 |" in end_only and "?" not in end_only


@pytest.mark.parametrize("intervention", ["state_passing", "random_noise"])
def test_validating_more_often_leaves_training_identical(tmp_path, experiment, runs, intervention):
    """Validation (the loss batches and the position-wise diagnostics with the reset control) draws on no random
    state and no data position that training uses: validating every step gives the same losses and
    the same weights, bit for bit, as validating only after the last step."""
    from recurlen.training.finetune import run_finetune

    _, base, _ = runs
    common = ("trainer.max_steps=6", f"intervention={intervention}", "intervention.reset_prob=0.3",
              f"model.pretrained={base}/checkpoints/last.ckpt", "trainer.checkpoint_every_n_steps=0")
    last = run_finetune(experiment(tmp_path / "last", *FAR, *common, "trainer.val_every_n_steps=6"))
    every = run_finetune(experiment(tmp_path / "every", *FAR, *common, "trainer.val_every_n_steps=1"))
    rows = {name: [(r["step"], r["train/loss"]) for r in read_metrics(d / "metrics.csv") if "train/loss" in r]
            for name, d in (("last", last), ("every", every))}
    assert len(rows["last"]) == 6 and rows["last"] == rows["every"]
    assert len(_logged(every, "val/full_minus_reset@[16T,32T)")) == 6 and list(_logged(last, "val/loss")) == [6]
    a, b = (torch.load(d / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
            for d in (last, every))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
