"""Needle in a haystack (recurlen's tasks after RULER's): needle placement in tokens, the exact scorer, determinism,
a tiny run."""

import json

import numpy as np
import pytest

from recurlen.evaluation.tasks.niah import (
    INTRO,
    NEEDLE,
    FillerHaystack,
    NiahBuilder,
    TextHaystack,
    read_values,
    score_niah,
)
from recurlen.evaluation.tasks.niah_config import NIAH_TASKS, NiahConfig
from recurlen.evaluation.tasks.niah_eval import cell_prompts
from recurlen.util.tokenizers import ByteTokenizer


@pytest.fixture(scope="module")
def builder():
    return NiahBuilder(ByteTokenizer(), NiahConfig())


@pytest.mark.parametrize("task", NIAH_TASKS)
@pytest.mark.parametrize("depth", [0.0, 0.3, 0.5, 0.8, 1.0])
@pytest.mark.parametrize("length", [450, 1000, 3000])
def test_needles_sit_at_the_requested_depth_and_length_is_exact(builder, task, depth, length):
    tok = ByteTokenizer()
    rng = np.random.default_rng([7, length])
    sample = builder.sample(rng, task)
    p = builder.build(rng, sample, length=length, depth=depth, haystack=FillerHaystack(tok), index=0)
    assert len(p.ids) == length
    block = tok.encode("".join(NEEDLE.format(kind=sample.kind, key=k, value=v) for k, v in sample.asked))
    assert p.ids[p.needle_start:p.needle_start + p.needle_tokens] == block  # the needles are where it says
    # Depth on token positions: the haystack tokens in front of the needles, over all haystack tokens.
    others = ["".join(NEEDLE.format(kind=sample.kind, key=k, value=v)) for k, v in sample.distractors]
    in_front = tok.decode(p.ids[:p.needle_start])
    distractor_tokens = sum(len(tok.encode(o)) for o in others if o in in_front)
    hay_in_front = p.needle_start - len(tok.encode(INTRO.format(plural=sample.kind + "s"))) - distractor_tokens
    assert hay_in_front == p.hay_before == round(depth * p.n_hay)
    assert abs(hay_in_front / p.n_hay - depth) <= 1.0 / p.n_hay
    # Every distractor needle is in the prompt once; the asked-for values only in the block.
    text = tok.decode(p.ids)
    assert all(text.count(o) == 1 for o in others)
    assert all(text.count(v) == 1 for v in sample.expected)


def test_task_shapes_follow_ruler(builder):
    rng = np.random.default_rng(3)
    kinds = {t: builder.sample(rng, t) for t in NIAH_TASKS}
    assert [len(kinds[t].expected) for t in NIAH_TASKS] == [1, 1, 1, 1, 4, 4]
    assert [len(kinds[t].distractors) for t in NIAH_TASKS] == [0, 0, 0, 3, 0, 0]
    assert len(kinds["single_number"].expected[0]) == 7 and kinds["single_number"].expected[0][0] != "0"
    assert len(read_values(kinds["single_uuid"].expected[0], "uuid")) == 1
    assert read_values(kinds["single_word"].expected[0], "word") == kinds["single_word"].expected
    assert len({k for k, _ in kinds["multivalue"].asked}) == 1  # four values of one key
    assert len({k for k, _ in kinds["multiquery"].asked}) == 4  # four keys asked at once
    assert len({k for k, _ in kinds["multikey"].asked + kinds["multikey"].distractors}) == 4
    for t in ("multiquery", "single_word"):  # every key the question names has its needle
        s = kinds[t]
        assert all(k in s.question for k, _ in s.asked)


def test_scorer_is_exact_with_partial_credit_for_several_values():
    assert score_niah(" 1234567", ["1234567"], "number") == 1.0
    assert score_niah(" 1234567.\nWhat", ["1234567"], "number") == 1.0
    assert score_niah(" 7654321", ["1234567"], "number") == 0.0  # wrong
    assert score_niah(" 12345678", ["1234567"], "number") == 0.0  # a longer number is not the value
    assert score_niah(" 123456", ["1234567"], "number") == 0.0
    assert score_niah(" nothing here", ["1234567"], "number") == 0.0
    four = ["1111111", "2222222", "3333333", "4444444"]
    assert score_niah(" 1111111, 2222222, 3333333, 4444444", four, "number") == 1.0
    assert score_niah(" 3333333, 1111111, 9999999", four, "number") == 0.5  # partial: two of four, any order
    assert score_niah(" 1111111, 1111111", four, "number") == 0.25  # a value repeated counts once
    assert score_niah(" Quiet-Harbor", ["quiet-harbor"], "word") == 1.0
    assert score_niah(" quiet-harbors", ["quiet-harbor"], "word") == 0.0
    assert score_niah(" very-quiet-harbor", ["quiet-harbor"], "word") == 0.0
    u = "21d7d982-f8bd-4045-b8e8-cd4ea93d7d0a"
    assert score_niah(" " + u.upper() + ".", [u], "uuid") == 1.0
    assert score_niah(" " + u[:-1] + "b", [u], "uuid") == 0.0
    with pytest.raises(ValueError, match="at least one expected value"):
        score_niah(" 1", [], "number")


def test_prompts_are_a_pure_function_of_the_seed(builder):
    hay = FillerHaystack(ByteTokenizer())
    for task in NIAH_TASKS:
        a = cell_prompts(builder, task, length=800, depth=0.4, trials=3, seed=11, haystack=hay)
        b = cell_prompts(NiahBuilder(ByteTokenizer(), NiahConfig()), task, length=800, depth=0.4, trials=3, seed=11,
                         haystack=FillerHaystack(ByteTokenizer()))
        c = cell_prompts(builder, task, length=800, depth=0.4, trials=3, seed=12, haystack=hay)
        assert [p.ids for p in a] == [p.ids for p in b] and [p.answer_ids for p in a] == [p.answer_ids for p in b]
        assert [p.sample.expected for p in a] != [p.sample.expected for p in c]
        assert len({tuple(p.sample.expected) for p in a}) == 3  # the trials differ


def test_text_haystack_rows_and_their_limits():
    hay = TextHaystack("heldout", rows=[[1, 2, 3, 4], [5, 6, 7, 8]])
    assert hay.tokens(0, 3) == [1, 2, 3] and hay.tokens(1, 4) == [5, 6, 7, 8] and hay.tokens(2, 2) == [1, 2]
    with pytest.raises(ValueError, match="holds 4 tokens per sequence; a prompt needs 5"):
        hay.tokens(0, 5)
    emb = TextHaystack("embedded", tokenizer=ByteTokenizer())
    assert emb.tokens(3, 50) == emb.tokens(3, 50) != emb.tokens(4, 50) and len(emb.tokens(3, 50)) == 50


def test_too_short_lengths_and_bad_settings_are_refused(builder):
    rng = np.random.default_rng(0)
    sample = builder.sample(rng, "multiquery")
    with pytest.raises(ValueError, match=r"L=100 is too short for a multiquery prompt.*need L >= \d+"):
        builder.build(rng, sample, length=100, depth=0.5, haystack=FillerHaystack(ByteTokenizer()), index=0)
    with pytest.raises(ValueError, match=r"depth=1.5 is outside \[0, 1\]"):
        builder.build(rng, sample, length=1000, depth=1.5, haystack=FillerHaystack(ByteTokenizer()), index=0)
    with pytest.raises(ValueError, match=r"task.niah.tasks has \['single'\]; allowed: \['single_number'"):
        NiahConfig(tasks=["single"])
    with pytest.raises(ValueError, match=r"task.niah.depths has 2.0"):
        NiahConfig(depths=[0.5, 2.0])
    with pytest.raises(ValueError, match="num_queries=5 exceeds num_keys=4"):
        NiahConfig(num_queries=5)
    with pytest.raises(ValueError, match="task.niah.haystack='pg19' is unknown"):
        NiahConfig(haystack="pg19")


def test_training_examples_fill_the_context_and_score_the_answer():
    from recurlen.evaluation.tasks.config import load_task_experiment
    from recurlen.evaluation.tasks.datamodules import build_task_datamodule

    cfg = load_task_experiment(["experiment=niah", "data.batch_size=6"])
    dm = build_task_datamodule(cfg)
    b = dm.train_batch(3)
    assert b["input_ids"].shape == (6, 512)
    tok = ByteTokenizer()
    for row in range(6):
        masked = b["targets"][row][b["loss_mask"][row]].tolist()
        assert masked[-1] == tok.eos_id and b["targets"][row][-1] == tok.eos_id  # prompt + answer + EOS fill T + 1
        answer = tok.decode(masked[:-1])
        text = tok.decode(b["input_ids"][row].tolist())
        assert text.startswith("Secret ") and text.endswith(answer)
        assert all(text.count(v) >= 2 for v in answer.strip().split(", "))  # in a needle and in the answer


def test_tiny_niah_run_writes_results_heatmap_and_report(tmp_path, run_tiny_task):
    path = run_tiny_task("niah", "data.seq_len=400", "data.batch_size=2", "trainer.max_steps=2",
                         "trainer.val_every_n_steps=2", "intervention.fit_batches=1", "task.lengths=[400,520]",
                         "task.trials=2", "task.niah.depths=[0.0,1.0]", "task.niah.haystack=heldout",
                         "task.niah.tasks=[single_number,multivalue]", "data.max_documents=60",
                         "data.val_fraction=0.2")
    assert path == tmp_path / "run" / "niah" / "results.json"
    res = json.loads(path.read_text())
    assert res["format"] == "recurlen.tasks.niah/1" and res["train_len"] == 400 and res["haystack"] == "heldout"
    assert res["tasks"] == ["single_number", "multivalue"] and res["lengths"] == [400, 520]
    assert len(res["cells"]) == 8 and all(c["trials"] == 2 and 0 <= c["all_correct"] <= 2 for c in res["cells"])
    for c in res["cells"]:  # each trial's score is kept: the cell's accuracy is their mean
        assert len(c["scores"]) == 2 and c["accuracy"] == pytest.approx(sum(c["scores"]) / 2)
        assert c["all_correct"] == sum(s == 1.0 for s in c["scores"])
    assert np.array(res["accuracy"]["multivalue"]).shape == (2, 2)  # depth x length
    cell = next(c for c in res["cells"] if c["task"] == "multivalue" and c["length"] == 520 and c["depth"] == 1.0)
    assert res["accuracy"]["multivalue"][1][1] == cell["accuracy"]
    assert all(len(e["expected"]) == 4 for e in cell["examples"])
    png = path.parent / res["plots"]["figure"]
    assert png.name == "niah_heatmap.png" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from recurlen.commands.report import write_report

    text = write_report([path], out_dir=tmp_path / "report").read_text()
    by_len = res["accuracy_by_length"]["multivalue"]
    assert "### Needle in a haystack" in text and "run (T = 400, heldout haystack, 2 trials per cell)" in text
    assert f"| multivalue | {by_len['400']:.2f} | {by_len['520']:.2f} |" in text
    assert "![niah run](niah_0_run.png)" in text and (tmp_path / "report" / "niah_0_run.png").is_file()


def test_heatmap_has_a_panel_per_task_and_their_mean():
    from recurlen.evaluation.tasks.niah_eval import mean_matrix, plot_niah

    acc = {"single_number": [[1.0, 0.5], [0.0, 0.5]], "multikey": [[0.0, 0.5], [1.0, 0.0]]}
    res = {"tasks": list(acc), "lengths": [512, 1024], "depths": [0.0, 1.0], "trials": 2, "haystack": "filler",
           "train_len": 512, "accuracy": acc}
    assert mean_matrix(res) == [[0.5, 0.5], [0.5, 0.25]]
    fig = plot_niah(res)
    assert [ax.get_title() for ax in fig.axes[:3]] == ["single_number", "multikey", "mean over tasks"]
    assert fig._suptitle.get_text().endswith("trained at 512 tokens (dashed)")
    one = plot_niah({**res, "tasks": ["multikey"], "train_len": 256})  # one task: no mean; no length inside T
    assert [ax.get_title() for ax in one.axes[:-1]] == ["multikey"] and "(dashed)" not in one._suptitle.get_text()
