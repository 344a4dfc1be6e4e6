"""Verdicts read on their intervals: one synthetic case per outcome (fails / holds / between / undecided), the
checks and the in-context cost, and the intervals themselves against known values."""

from __future__ import annotations

import json

import numpy as np
import pytest

from recurlen.commands.demo import demo_checks
from recurlen.commands.report import write_report
from recurlen.diagnostics.intervals import (
    binomial_interval,
    decide,
    paired_bootstrap,
    ratio_bootstrap,
    sequences_to_decide,
    t_interval,
)
from recurlen.evaluation.evidence import in_context_cost, interval_status, run_verdict
from tests.synthetic_results import positionwise_run, with_sequences


def spread(mean: float, sd: float, n: int = 64, seed: int = 0) -> list[float]:
    """n per-sequence values with exactly this mean and sample standard deviation."""
    x = np.random.default_rng(seed).normal(size=n)
    x = (x - x.mean()) / x.std(ddof=1)
    return list(mean + sd * x)


def run_with(label: str, far: dict[str, tuple[float, float]], *, n: int = 64, loss0: float = 2.0,
             context_sd: float = 0.05, context_seed: int = 99) -> dict:
    """A 6-bin run whose far bins have per-sequence full - reset of the given (mean, sd)."""
    run = positionwise_run(label, {"[0,T)": loss0})
    diffs = {name: spread(m, sd, n, seed=i) for i, (name, (m, sd)) in enumerate(far.items())}
    return with_sequences(run, diffs, context=spread(loss0, context_sd, n, seed=context_seed))


def test_intervals_against_known_values():
    assert binomial_interval(7, 8) == pytest.approx((0.5291, 0.9776), abs=1e-4)  # Wilson, 95%
    assert binomial_interval(0, 8)[0] == 0.0 and binomial_interval(8, 8)[1] == 1.0
    lo, hi = t_interval([1.0, 2.0, 3.0])
    assert (lo, hi) == pytest.approx((2 - 4.3027 / 3 ** 0.5, 2 + 4.3027 / 3 ** 0.5), abs=1e-3)  # t(0.975, 2)
    # The bootstrap interval of a mean is about mean +- 1.96 sd / sqrt(n) for a normal sample.
    x = np.array(spread(0.2, 0.4, n=400))
    lo, hi = paired_bootstrap(x)
    assert lo == pytest.approx(0.2 - 1.96 * 0.4 / 20, abs=0.01) and hi == pytest.approx(0.2 + 1.96 * 0.4 / 20,
                                                                                          abs=0.01)
    assert paired_bootstrap(x, seed=5) == paired_bootstrap(x, seed=5)  # seeded: reproducible
    a, b = np.array(spread(2.1, 0.1, 64)), np.array(spread(2.0, 0.1, 64))
    lo, hi = ratio_bootstrap(a, b)
    assert lo < 0.05 < hi and hi - lo < 0.05
    with pytest.raises(ValueError, match="at least 2 sequences"):
        paired_bootstrap([0.1])


def test_decide_each_outcome():
    assert decide(0.5, 0.4, 0.6, n=64, fail_bar=0.3, hold_bar=0.05).outcome == "fails"
    assert decide(0.0, -0.02, 0.03, n=64, fail_bar=0.3, hold_bar=0.05).outcome == "holds"
    assert decide(0.15, 0.1, 0.2, n=64, fail_bar=0.3, hold_bar=0.05).outcome == "between"
    d = decide(0.28, 0.2, 0.36, n=64, fail_bar=0.3, hold_bar=0.05)
    assert (d.outcome, d.bar) == ("undecided", 0.3)
    assert d.needed_n == sequences_to_decide(0.28, 0.08, 0.3, n=64) == 1024  # 64 x (0.08 / 0.02)^2


def test_a_run_that_fails_holds_lies_between_or_is_undecided():
    fails = run_verdict(run_with("base", {"[4T,8T)": (0.2, 0.3), "[8T,16T)": (0.6, 0.3), "[16T,32T)": (0.9, 0.3)}))
    assert fails["outcome"] == "fails" and fails["fails"]
    assert "FAILS past the training context: full - reset +0.600 [+0.5" in fails["text"]
    assert "95% intervals over 64 held-out sequences" in fails["text"]

    holds = run_verdict(run_with("tbptt", {"[T,2T)": (-0.06, 0.1), "[2T,4T)": (-0.06, 0.1), "[4T,8T)": (-0.05, 0.1),
                                           "[8T,16T)": (-0.04, 0.1), "[16T,32T)": (-0.03, 0.1)}))
    assert holds["outcome"] == "holds" and holds["generalizes"]
    assert holds["text"].startswith("tbptt: length-generalizes up to 32T (full - reset <= +0.05 in every bin, "
                                    "upper ends included; worst -0.030 [")

    between = run_verdict(run_with("gla", {"[8T,16T)": (0.15, 0.1)}))
    assert between["outcome"] == "between" and "mostly holds" in between["text"]

    # +0.03 with an interval reaching past +0.05: it holds on the point value but not on its interval.
    undecided = run_verdict(run_with("sp", {"[8T,16T)": (0.03, 0.2)}))
    assert undecided["outcome"] == "undecided" and undecided["possible"] == ["between", "holds"]
    assert undecided["needed_sequences"] > 64
    assert ("sp: undecided at 64 sequences between mostly holds and holds: full - reset +0.030 [" in
            undecided["text"])
    assert f"straddles +0.05; about {undecided['needed_sequences']} sequences would decide it" in undecided["text"]
    # More sequences of the same spread decide it: the interval shrinks clear of the bar.
    assert run_verdict(run_with("sp", {"[8T,16T)": (0.03, 0.2)}, n=undecided["needed_sequences"] * 2))[
        "outcome"] == "holds"


def test_one_failing_bin_decides_a_failure_whatever_the_others():
    v = run_verdict(run_with("x", {"[4T,8T)": (0.03, 0.3), "[8T,16T)": (0.8, 0.1)}))
    assert v["outcome"] == "fails"


def test_results_without_per_sequence_scores_are_judged_on_points_and_say_so():
    v = run_verdict(positionwise_run("old", {"[0,T)": 2.0, "[8T,16T)": 0.5}))
    assert v["outcome"] == "fails" and "point values: the results keep no per-sequence scores" in v["text"]


def test_in_context_cost_is_paired_when_the_sequences_are_the_same():
    base = run_with("base", {"[8T,16T)": (0.6, 0.2)}, context_sd=0.3)
    run = run_with("tbptt", {"[8T,16T)": (0.0, 0.1)}, loss0=2.02, context_sd=0.3)
    paired = in_context_cost(run, base)
    assert paired.value == pytest.approx(0.01) and paired.paired and paired.n == 64
    # The same sequences (same noise) resampled together: the interval is far narrower than an unpaired one.
    run["positionwise"]["sequences_digest"] = "other"
    unpaired = in_context_cost(run, base)
    assert not unpaired.paired
    assert paired.interval[1] - paired.interval[0] < (unpaired.interval[1] - unpaired.interval[0]) / 5


def test_checks_pass_miss_or_are_undecided_on_their_intervals():
    assert interval_status(">=", 0.3, 0.5, (0.35, 0.6)) == "pass"
    assert interval_status(">=", 0.3, 0.2, (0.1, 0.29)) == "miss"
    assert interval_status(">=", 0.3, 0.32, (0.25, 0.4)) == "undecided"
    assert interval_status("<=", 0.05, 0.0, (-0.1, 0.05)) == "pass"
    assert interval_status("abs<=", 0.08, 0.075, (0.06, 0.09)) == "undecided"
    assert interval_status("abs<=", 0.08, -0.1, (-0.12, -0.09)) == "miss"
    assert interval_status("<=", 0.05, None, None) == "miss"


def test_demo_checks_and_report_state_interval_and_sample(tmp_path):
    runs = [run_with("base", {"[4T,8T)": (0.3, 0.3), "[8T,16T)": (0.6, 0.3), "[16T,32T)": (0.9, 0.3)}),
            run_with("none", {"[8T,16T)": (0.31, 0.3)}),                   # at the bar: undecided
            run_with("state_passing", {"[8T,16T)": (0.02, 0.05)}, loss0=2.15, context_sd=0.3,
                     context_seed=7),  # holds; +7.5% cost on other per-sequence losses: undecided
            run_with("tbptt", {"[8T,16T)": (0.0, 0.02), "[16T,32T)": (0.2, 0.05)}, loss0=2.01)]
    status = {c["check"]: c["status"] for c in demo_checks(runs)}
    assert status == {
        "baseline fails: full - reset >= +0.3 in [8T,16T)": "pass",
        "state_passing fixes it: full - reset <= +0.05 in every bin up to 16T": "pass",
        "state_passing holds past 16T: full - reset <= +0.05 in [16T,32T)": "pass",
        "state_passing keeps the [0,T) loss within 8% of the baseline's": "undecided",
        "tbptt fixes it: full - reset <= +0.05 in every bin up to 16T": "pass",
        "tbptt holds past 16T: full - reset <= +0.05 in [16T,32T)": "miss",
        "tbptt keeps the [0,T) loss within 8% of the baseline's": "pass",
        "plain fine-tuning (none) still fails: full - reset >= +0.3 in [8T,16T)": "undecided",
    }
    results = tmp_path / "eval" / "results.json"
    results.parent.mkdir()
    results.write_text(json.dumps({"format": "recurlen.eval/1", "runs": runs}))
    text = write_report([results.parent], out_dir=tmp_path / "out", checks=demo_checks).read_text()
    assert "**5 of 8 checks passed, 2 undecided, 1 missed.** Undecided: state_passing keeps" in text
    assert "| baseline fails: full - reset >= +0.3 in [8T,16T) | +0.600 | [+0.5" in text
    assert "(64) | PASS |" in text and "| UNDECIDED (about " in text
    assert "- state_passing: in-context cost +7.5% (95% interval [+" in text
    assert "paired bootstrap over 64 sequences): undecided against the 8% bar" in text
    merged = json.loads((tmp_path / "out" / "results.json").read_text())
    # Anyone can recompute an interval from the file alone: the per-sequence losses are in it.
    base = merged["runs"][0]["positionwise"]
    diff = np.array(base["per_sequence"]["loss"]) - np.array(base["per_sequence"]["reset_loss"])
    lo, hi = paired_bootstrap(diff, seed=base["interval"]["seed"])
    assert base["bins"][4]["full_minus_reset_ci"] == [pytest.approx(lo[4]), pytest.approx(hi[4])]
