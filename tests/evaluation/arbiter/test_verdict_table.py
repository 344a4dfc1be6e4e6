"""The arbiter's verdicts and table on synthetic results: retrieves / loses retrieval / undecided per length (a Wilson
interval against the bar), and the loss verdict beside it ("holds the loss by forgetting")."""

import pytest

from recurlen.diagnostics.intervals import binomial_interval
from recurlen.evaluation.arbiter.table import arbiter_lines
from recurlen.evaluation.arbiter.verdict import arbiter_verdict, length_name
from recurlen.evaluation.tasks.retrieval import reach, retrieval_by_length, verdict

T = 256
FACTORS = (1, 2, 4, 8)


def loss_entry(far: float, ci_half: float = 0.02, *, n: int = 32) -> dict:
    """A `recurlen eval` run entry whose full - reset is `far` in every bin past T, +- ci_half."""
    bins = [{"name": "[0,T)", "start": 0, "end": T, "loss": 2.0, "full_minus_reset": 0.0,
             "full_minus_reset_ci": [-0.001, 0.001]}]
    for k in FACTORS[:-1]:
        bins.append({"name": f"[{k}T,{2 * k}T)", "start": k * T, "end": 2 * k * T, "loss": 1.8 + far,
                     "full_minus_reset": far, "full_minus_reset_ci": [far - ci_half, far + ci_half]})
    return {"label": "x", "train_len": T, "unigram_loss": 3.0,
            "positionwise": {"train_len": T, "seq_len": FACTORS[-1] * T, "num_sequences": n, "bins": bins}}


def passkey_result(correct_by_factor: dict[int, int], *, trials: int = 16, depths=(0.0, 0.5, 1.0)) -> dict:
    """Passkey cells whose pooled count at factor k x T is correct_by_factor[k] of trials x len(depths)."""
    cells = []
    for k in FACTORS:
        left = correct_by_factor[k]
        for d in depths:
            c = min(left, trials)
            left -= c
            cells.append({"length": k * T, "depth": d, "trials": trials, "correct": c, "accuracy": c / trials,
                          "outcomes": [1] * c + [0] * (trials - c)})
    return {"lengths": [k * T for k in FACTORS], "depths": list(depths), "trials": trials, "cells": cells}


def entry(label: str, kind: str, far: float, correct: dict[int, int], **kw) -> dict:
    loss = loss_entry(far, **kw)
    loss["label"] = label
    return {"label": label, "kind": kind, "train_len": T, "loss": loss, "passkey": passkey_result(correct)}


BASE = entry("base", "base", 0.6, {1: 47, 2: 40, 4: 10, 8: 0})


def test_wilson_verdict_against_the_bar():
    # 48 of 48: [0.926, 1] retrieves; 0 of 48 loses retrieval; 24 of 48 straddles 0.5
    assert verdict(48, 48) == (binomial_interval(48, 48), "retrieves")
    assert verdict(0, 48)[1] == "loses retrieval"
    assert verdict(24, 48)[1] == "undecided"
    # 31 of 48 (0.65, lower end 0.50...) vs 30 of 48 (0.625, lower end under 0.5): the bar decides by the interval
    lo31 = binomial_interval(31, 48)[0]
    assert (verdict(31, 48)[1] == "retrieves") == (lo31 >= 0.5)
    assert verdict(30, 48)[1] == "undecided"
    with pytest.raises(ValueError, match=r"retrieval bar must be in \(0, 1\)"):
        verdict(1, 2, bar=1.0)


def test_retrieval_by_length_pools_depths_and_reads_the_outcomes():
    cells = retrieval_by_length(BASE["passkey"])
    assert [(c.length, c.correct, c.trials) for c in cells] == [(256, 47, 48), (512, 40, 48), (1024, 10, 48),
                                                                 (2048, 0, 48)]
    assert [c.verdict for c in cells] == ["retrieves", "retrieves", "loses retrieval", "loses retrieval"]
    assert reach(cells) == 512 and length_name(512, T) == "2T"
    broken = passkey_result({1: 3, 2: 0, 4: 0, 8: 0})
    broken["cells"][0]["outcomes"] = [1, 1]
    with pytest.raises(ValueError, match="outcomes summing to 2 disagree with trials=16 correct=3"):
        retrieval_by_length(broken)
    del broken["cells"][0]["outcomes"]
    with pytest.raises(ValueError, match="keeps no per-trial outcomes"):
        retrieval_by_length(broken)


@pytest.mark.parametrize("far, correct, word, words", [
    # flat loss, and it loses the key at T and 2T where the base retrieves: forgetting
    (-0.05, {1: 10, 2: 2, 4: 0, 8: 0}, "holds by forgetting", "holds the loss by forgetting: loses retrieval at T, 2T"),
    # flat loss and retrieval at least as far as the base
    (-0.05, {1: 48, 2: 48, 4: 40, 8: 5}, "holds and retrieves", "holds the loss and retrieves to 4T"),
    # failure past T whatever it retrieves
    (0.8, {1: 48, 2: 48, 4: 0, 8: 0}, "fails", "fails past T (loss); retrieves to 2T"),
    # flat loss but 24 of 48 at 2T: the retrieval interval straddles the bar
    (-0.05, {1: 48, 2: 24, 4: 0, 8: 0}, "undecided", "undecided: holds the loss; undecided at 2T"),
    # under the failure bar but over the hold bar: mostly holds, and forgets
    (0.1, {1: 0, 2: 0, 4: 0, 8: 0}, "holds by forgetting", "mostly holds the loss by forgetting"),
])
def test_the_two_verdicts_together(far, correct, word, words):
    v = arbiter_verdict(entry("base+fix", "fix", far, correct), base=BASE)
    assert v["verdict"] == word and words in v["text"]


def test_a_base_that_does_not_retrieve_within_T_cannot_arbitrate():
    base = entry("base", "base", 0.6, {1: 20, 2: 0, 4: 0, 8: 0})
    v = arbiter_verdict(entry("base+fix", "fix", -0.05, {1: 0, 2: 0, 4: 0, 8: 0}), base=base)
    assert v["verdict"] == "base does not retrieve"
    assert "retrieval cannot arbitrate" in v["text"] and "0.42 [" in v["text"]
    # with nothing the base retrieves to compare with, the model's own verdict at T stands (not "retrieves")
    assert v["retrieval"]["outcome"] == "loses retrieval" and v["retrieval"]["lost"] == []


def test_loss_undecided_is_said():
    # full - reset +0.05 +- 0.03 straddles the hold bar: undecided, whatever retrieval says
    v = arbiter_verdict(entry("post", "post", 0.06, {1: 48, 2: 48, 4: 0, 8: 0}, ci_half=0.03), base=BASE)
    assert v["verdict"] == "undecided" and v["text"] == "undecided: the loss is undecided; retrieves to 2T"


def test_table_has_both_verdicts_with_intervals():
    fix = entry("base+forget_more", "fix", -0.05, {1: 10, 2: 2, 4: 0, 8: 0})
    fix["fix"] = {"values": {"memory_T": 1.0, "entries_changed": 3, "entries": 4}}
    post = entry("fitted_noise", "post", -0.02, {1: 48, 2: 48, 4: 46, 8: 20})
    post["steps"] = 300
    lines, verdicts = arbiter_lines({"retrieval_bar": 0.5, "bases": [{"label": "base",
                                                                      "entries": [BASE, post, fix]}]})
    text = "\n".join(lines)
    assert "| model | loss [0,T) (cost) | full - reset [2T,4T) | full - reset [4T,8T) | loss verdict | passkey T |" \
        in text
    row = next(line for line in lines if line.startswith("| base+forget_more (memory cap 1 T, 3 of 4 entries changed)"))
    lo, hi = binomial_interval(10, 48)
    assert f"0.21 [{lo:.2f}, {hi:.2f}]" in row and "-0.050 [-0.070, -0.030]" in row
    assert "holds the loss by forgetting" in row and "| loses retrieval at T, 2T |" in row
    assert "| fitted_noise (300 steps) | 2.000 (+0.0%" in text
    assert [v["verdict"] for v in verdicts] == ["fails", "holds and retrieves", "holds by forgetting"]
    assert "48 trials per length (16 keys x depths 0, 0.5, 1)" in text
