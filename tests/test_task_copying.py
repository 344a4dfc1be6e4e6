"""Synthetic copying: examples, scorer, the seed summary, and a tiny sweep through the normal training path."""

import json

import numpy as np
import pytest
import torch

from recurlen.tasks.common import rows_from_examples
from recurlen.tasks.config import CopyingConfig
from recurlen.tasks.copying import CopyingFormat, char_accuracy, headline_length, summarize
from recurlen.tokenizer import ByteTokenizer


def test_examples_are_string_separator_copy_eos():
    tok = ByteTokenizer()
    fmt = CopyingFormat(tok, CopyingConfig(length=10, min_length=3, alphabet_size=4))
    lengths = set()
    for seed in range(200):
        ex = fmt.training_example(np.random.default_rng(seed), seq_len=21)
        text = tok.decode(ex.ids[:-1])
        s, copy = text.split("|")
        assert s == copy and set(s) <= set("abcd") and ex.ids[-1] == tok.eos_id
        assert ex.answer_start == len(s) + 1 and len(ex.ids) == 2 * len(s) + 2
        lengths.add(len(s))
    assert lengths == set(range(3, 11))  # uniform over min_length..n: every length shows up
    ex = fmt.training_example(np.random.default_rng(0), seq_len=21)
    batch = rows_from_examples([ex], seq_len=21, pad_id=tok.eos_id)
    k = ex.answer_start - 1
    # the loss is on the copy and its EOS, never on the random string or the padding
    assert batch["loss_mask"][0].nonzero().flatten().tolist() == list(range(k, 2 * k + 1))
    scored = batch["targets"][0][batch["loss_mask"][0]].tolist()
    assert scored == ex.ids[:k] + [tok.eos_id]
    with pytest.raises(ValueError, match=r"data.seq_len=15 is too short for copying strings of length 10.*>= 21"):
        fmt.training_example(np.random.default_rng(0), seq_len=15)


def test_char_accuracy_and_errors():
    assert char_accuracy([1, 2, 3, 4], [1, 2, 3, 4]) == 1.0
    assert char_accuracy([1, 9, 3, 9], [1, 2, 3, 4]) == 0.5
    assert char_accuracy([1, 2], [1, 2, 3, 4]) == 0.5  # stopped early: the missing positions are wrong
    assert char_accuracy([2, 3, 4, 5], [1, 2, 3, 4]) == 0.0  # shifted by one is wrong everywhere
    with pytest.raises(ValueError, match="target string is empty"):
        char_accuracy([1], [])


def test_summary_mean_and_sample_std_over_seeds():
    runs = [{"intervention": "none", "seed": s, "char_accuracy": {"8": 1.0, "24": a}}
            for s, a in enumerate([0.2, 0.3, 0.4])]
    runs += [{"intervention": "state_passing", "seed": 0, "char_accuracy": {"8": 0.9, "24": 0.5}}]
    out = summarize(runs, lengths=[8, 24], headline=24)
    assert out["none"]["at_headline"] == {"length": 24, "mean": pytest.approx(0.3), "std": pytest.approx(0.1)}
    assert out["none"]["std"]["8"] == 0.0 and out["none"]["seeds"] == [0, 1, 2]
    assert out["state_passing"]["at_headline"]["std"] == 0.0  # one seed
    assert headline_length([8, 16, 24, 32], n=8, factor=3) == 24
    assert headline_length([8, 20, 30], n=8, factor=3) == 30


def test_config_and_tokenizer_errors(tmp_path):
    from recurlen.experiment.compose import load_experiment

    with pytest.raises(ValueError, match=r"interventions has 'tbptt'; allowed: \['none', 'random_noise'"):
        load_experiment(["experiment=copying", "task.copying.interventions=[none,tbptt]"])
    with pytest.raises(ValueError, match="min_length=9 exceeds length=8"):
        load_experiment(["experiment=copying", "task.copying.min_length=9"])
    with pytest.raises(ValueError, match="alphabet_size=40 is not allowed; need 2..26"):
        CopyingConfig(alphabet_size=40)


def test_tiny_copying_sweep_trains_each_intervention_through_the_normal_path(tmp_path, run_tiny_task):
    from recurlen.runs import RUN_META_KEY

    path = run_tiny_task("copying", "data.seq_len=9", "data.batch_size=4", "trainer.max_steps=3",
                         "trainer.val_every_n_steps=3", "task.copying.length=4", "task.copying.seeds=[0]",
                         "task.lengths=[4,12]", "task.trials=4")
    res = json.loads(path.read_text())
    assert res["format"] == "recurlen.tasks.copying/1" and res["headline_length"] == 12
    assert [(r["intervention"], r["seed"]) for r in res["runs"]] == [("none", 0), ("state_passing", 0)]
    for r in res["runs"]:
        assert set(r["char_accuracy"]) == {"4", "12"} and all(0 <= v <= 1 for v in r["char_accuracy"].values())
        s = res["summary"][r["intervention"]]
        assert s["mean"] == r["char_accuracy"] and s["at_headline"]["mean"] == r["char_accuracy"]["12"]
    assert res["chance"] == pytest.approx(1 / 26)
    assert (path.parent / res["plots"]["figure"]).read_bytes()[:4] == b"\x89PNG"
    from recurlen.report import write_report

    text = write_report([path], out_dir=tmp_path / "report").read_text()
    s = res["summary"]["state_passing"]
    assert f"| state_passing | {s['mean']['4']:.3f} +- {s['std']['4']:.3f} | {s['mean']['12']:.3f}" in text
    # Each run went through run_finetune with its intervention: only state passing carries lane states.
    for name, carries in (("none", False), ("state_passing", True)):
        ckpt = torch.load(tmp_path / "run" / name / "seed0" / "checkpoints" / "last.ckpt", weights_only=True)
        meta = ckpt[RUN_META_KEY]
        assert meta["intervention"] == name and ckpt["global_step"] == 3
        assert (meta["carried"] is not None) == carries
        if carries:
            assert meta["carried"]["ssm"].abs().sum() > 0 and meta["carried"]["ssm"].shape[1] == 4
