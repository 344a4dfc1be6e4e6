"""The paired seed comparison the copying report states: Student's t and the exact sign-flip test."""

import math

import pytest

from recurlen.evaluation.tasks.copying import summarize
from recurlen.evaluation.tasks.paired import describe, incomplete_beta, paired_test, sign_flip_p, t_two_sided_p


@pytest.mark.parametrize("t, df, p", [(2.776445, 4, 0.05), (2.570582, 5, 0.05), (12.7062, 1, 0.05),
                                      (1.0, 10, 0.340893), (0.0, 3, 1.0), (4.604095, 4, 0.01)])
def test_t_two_sided_p_matches_the_tables(t, df, p):
    assert t_two_sided_p(t, df) == pytest.approx(p, rel=1e-4)
    assert t_two_sided_p(-t, df) == pytest.approx(p, rel=1e-4)


def test_incomplete_beta_known_values():
    assert incomplete_beta(1.0, 1.0, 0.3) == pytest.approx(0.3)  # uniform
    assert incomplete_beta(2.0, 3.0, 0.4) == pytest.approx(0.5248, abs=1e-4)
    assert incomplete_beta(0.5, 0.5, 0.5) == pytest.approx(0.5)
    with pytest.raises(ValueError, match=r"x must lie in \[0, 1\]"):
        incomplete_beta(1.0, 1.0, 1.5)


def test_sign_flips_enumerate_every_assignment():
    assert sign_flip_p([1.0, 1.0, 1.0, 1.0, 1.0]) == pytest.approx(2 / 32)  # the floor for 5 seeds
    assert sign_flip_p([1.0, -1.0]) == 1.0
    assert sign_flip_p([3.0, 1.0, 1.0]) == pytest.approx(2 / 8)  # (+,+,+) and (-,-,-) reach |5|


def test_paired_test_uses_the_per_seed_differences():
    control = [0.1, 0.5, 0.2, 0.4, 0.3]
    treated = [c + d for c, d in zip(control, [0.30, 0.35, 0.25, 0.40, 0.32])]
    got = paired_test(treated, control)
    diffs = [0.30, 0.35, 0.25, 0.40, 0.32]
    mean = sum(diffs) / 5
    std = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 4)
    assert got["mean_difference"] == pytest.approx(mean) and got["std_difference"] == pytest.approx(std)
    assert got["t"] == pytest.approx(mean / (std / math.sqrt(5)))
    assert got["p_t"] == pytest.approx(2.05e-4, rel=0.01) and got["significant"]
    assert got["p_sign_flip"] == pytest.approx(2 / 32)
    # The same values unpaired would be noisy; shuffled pairs are not significant.
    noisy = paired_test([0.5, 0.1, 0.6, 0.2, 0.7], [0.4, 0.5, 0.2, 0.6, 0.3])
    assert not noisy["significant"] and "not significant at 0.05" in describe(noisy)
    assert "too few seeds" in describe(paired_test([0.5], [0.1]))
    with pytest.raises(ValueError, match="one of each per seed"):
        paired_test([0.1, 0.2], [0.1])


def test_copying_summary_pairs_each_intervention_with_the_first_by_seed():
    def run(name, seed, a, st):
        single = {"lengths": [8, 24], "char_acc": {"8": 1.0, "24": a}, "greedy_char_acc": {"8": 1.0, "24": a}}
        return {"intervention": name, "seed": seed, "single": single, "stream": {"char_acc": st, "greedy_char_acc": st}}

    runs = [run("none", s, 0.2 + 0.01 * s, 0.1) for s in range(5)]
    runs += [run("state_passing", s, 0.2 + 0.01 * s + 0.1 + 0.001 * s, 0.1 + (-1) ** s * 0.2) for s in range(5)]
    out = summarize(runs, headline=24)
    assert "paired" not in out["none"]
    tests = out["state_passing"]["paired"]
    assert tests["against"] == "none" and tests["seeds"] == [0, 1, 2, 3, 4]
    assert tests["single"]["char_acc"]["mean_difference"] == pytest.approx(0.102)
    assert tests["single"]["char_acc"]["significant"]
    assert not tests["stream"]["char_acc"]["significant"]  # differences of +-0.2 that cancel
