"""One model judged by both verdicts on the same weights: the loss entry as `recurlen eval` writes a run (with each
sequence's losses and the bins' intervals) and the passkey result as `recurlen passkey` writes one (every trial)."""

import copy

import pytest
import torch

from recurlen.diagnostics.intervals import paired_bootstrap
from recurlen.evaluation.arbiter.judge import JudgeSettings, judge
from recurlen.evaluation.fixes.arguments import apply_fix, fix_configs
from recurlen.util.tokenizers import load_tokenizer

T = 256
SETTINGS = JudgeSettings(length_factors=[1, 2], depths=[0.0, 1.0], trials=2, num_sequences=3, chunk_len=256,
                         batch_size=4)


@pytest.fixture(scope="module")
def judged(nano_model):
    torch.manual_seed(0)
    sequences = torch.randint(0, 256, (3, 2 * T))
    tok = load_tokenizer("bytes")
    model = nano_model(vocab_size=tok.vocab_size)
    base = judge(model, label="base", kind="base", source="nano", sequences=sequences, tokenizer=tok, train_len=T,
                 settings=SETTINGS)
    fixed = copy.deepcopy(model)
    key, fix, cfg = fix_configs(["forget_more"], {"forget_more": {"memory": 0.5}})[0]
    record = apply_fix(fixed, key, fix, cfg, base="base", rows=None, length=2 * T, train_len=T)
    fixed_entry = judge(fixed, label="base+forget_more", kind="fix", source="nano", sequences=sequences,
                        tokenizer=tok, train_len=T, settings=SETTINGS, fix=record)
    return base, fixed_entry


def test_the_loss_entry_keeps_sequences_and_intervals(judged):
    base, _ = judged
    pw = base["loss"]["positionwise"]
    assert pw["seq_len"] == 2 * T and pw["num_sequences"] == 3 and [b["name"] for b in pw["bins"]] == ["[0,T)",
                                                                                                      "[T,2T)"]
    per = pw["per_sequence"]
    assert len(per["loss"]) == 3 and len(per["reset_loss"]) == 3
    # the interval in results.json is the paired bootstrap of the per-sequence differences it keeps
    diff = [[f - r for f, r in zip(fr, rr)] for fr, rr in zip(per["loss"], per["reset_loss"])]
    lo, hi = paired_bootstrap(diff, seed=base["loss"]["positionwise"]["interval"]["seed"])
    assert pw["bins"][1]["full_minus_reset_ci"] == pytest.approx([lo[1], hi[1]])


def test_the_passkey_result_keeps_every_trial(judged):
    base, _ = judged
    pk = base["passkey"]
    assert pk["lengths"] == [T, 2 * T] and pk["depths"] == [0.0, 1.0] and len(pk["cells"]) == 4
    for cell in pk["cells"]:
        assert len(cell["outcomes"]) == 2 and set(cell["outcomes"]) <= {0, 1}
        assert sum(cell["outcomes"]) == cell["correct"]


def test_a_fix_is_judged_on_its_own_weights(judged):
    base, fixed = judged
    assert fixed["kind"] == "fix" and fixed["fix"]["values"]["memory_T"] == 0.5
    # the memory cap at T/2 changes what the model predicts past T/2: the fixed loss is not the base's
    assert fixed["loss"]["positionwise"]["bins"][1]["loss"] != base["loss"]["positionwise"]["bins"][1]["loss"]


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match=r"must reach past T \(a factor >= 2\)"):
        JudgeSettings(length_factors=[1])
    with pytest.raises(ValueError, match=r"judge.depths=\[1.5\] must be in \[0, 1\]"):
        JudgeSettings(depths=[1.5])
    with pytest.raises(ValueError, match="judge.num_sequences must be >= 2"):
        JudgeSettings(num_sequences=1)
