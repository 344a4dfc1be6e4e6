"""Passkey retrieval: prompt geometry in tokens, the scorer, stateful greedy decoding, the DataModule, a tiny run."""

import json

import numpy as np
import pytest
import torch
from tensorboard.plugins.custom_scalar import layout_pb2

from recurlen.evaluation.tasks.common import greedy_answers
from recurlen.evaluation.tasks.passkey import KEY_SENTENCE, PasskeyBuilder, parse_passkey, score_passkey
from recurlen.util.tokenizers import ByteTokenizer, load_tokenizer


@pytest.fixture(scope="module")
def bpe_tokenizer(tmp_path_factory):
    """A small BPE tokenizer.json trained here (the format of GPT-NeoX-20B's), so merges cross piece boundaries."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from recurlen.evaluation.tasks.passkey import FILLER, INTRO, QUESTION

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([INTRO, FILLER * 20, QUESTION, KEY_SENTENCE.format(key="12345")] * 5, trainer)
    path = tmp_path_factory.mktemp("bpe") / "tokenizer.json"
    tok.save(str(path))
    return load_tokenizer(str(path))


@pytest.mark.parametrize("which", ["bytes", "bpe"])
@pytest.mark.parametrize("depth", [0.0, 0.1, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("length", [400, 1000, 3000])
def test_key_sits_at_the_requested_depth_and_length_is_exact(which, depth, length, bpe_tokenizer):
    tok = ByteTokenizer() if which == "bytes" else bpe_tokenizer
    b = PasskeyBuilder(tok)
    p = b.build(length=length, depth=depth, key="73521")
    assert len(p.ids) == length
    key_ids = tok.encode(KEY_SENTENCE.format(key="73521"))
    assert p.ids[p.key_start:p.key_start + len(key_ids)] == key_ids  # the key sentence is where it says
    assert p.ids.count(key_ids[0]) >= 1 and tok.decode(p.ids).count("73521") == 2
    # Depth on token positions: the share of filler tokens before the key, to within one token.
    before = p.key_start - len(b.intro)
    assert abs(before / p.n_filler - depth) <= 1.0 / p.n_filler
    # Relative to the whole prompt it is within the fixed intro/question overhead of the request.
    assert abs(p.key_start / length - depth) <= (length - p.n_filler) / length
    # Re-tokenizing the prompt text gives the requested length within 2% (pieces are tokenized separately).
    assert abs(len(tok.encode(tok.decode(p.ids))) - length) <= max(2, 0.02 * length)
    assert tok.decode(p.answer_ids).strip() == "73521"


def test_depths_order_key_positions():
    b = PasskeyBuilder(ByteTokenizer())
    starts = [b.build(length=2048, depth=d, key="11111").key_start for d in (0.1, 0.5, 0.9)]
    assert starts[0] < starts[1] < starts[2]
    assert starts == [round(len(b.intro) + d * (2048 - b.overhead("11111"))) for d in (0.1, 0.5, 0.9)]


def test_bad_depth_and_too_short_length():
    b = PasskeyBuilder(ByteTokenizer())
    with pytest.raises(ValueError, match=r"depth=1.5 is outside \[0, 1\]"):
        b.build(length=1000, depth=1.5, key="12345")
    with pytest.raises(ValueError, match=r"depth=-0.1 is outside \[0, 1\]"):
        b.build(length=1000, depth=-0.1, key="12345")
    need = b.overhead("12345")
    with pytest.raises(ValueError, match=rf"L=100 is too short to hold the key and the question.*need L >= {need}"):
        b.build(length=100, depth=0.5, key="12345")
    assert len(b.build(length=need, depth=0.5, key="12345").ids) == need  # the bound is tight
    with pytest.raises(ValueError, match="must be 5 digits"):
        b.build(length=1000, depth=0.5, key="12a45")


def test_scorer_exact_match_of_the_first_number():
    assert parse_passkey(" 12345") == "12345"
    assert parse_passkey("The pass key is 90210. Remember") == "90210"
    assert score_passkey(" 12345", "12345") == 1.0
    assert score_passkey(" 12345.\nWhat", "12345") == 1.0
    assert score_passkey(" 1234", "12345") == 0.0
    assert score_passkey(" 123456", "12345") == 0.0  # more digits is not the key
    assert score_passkey(" 54321", "12345") == 0.0
    assert score_passkey(" twelve", "12345") == 0.0  # not a number: 0, not an error
    with pytest.raises(ValueError, match=r"answer ' twelve' is not a number"):
        parse_passkey(" twelve")


def _full_forward_greedy(model, ids, steps):
    seq = list(ids)
    out = []
    for _ in range(steps):
        logits, _ = model(torch.tensor([seq]))
        nxt = int(logits[0, -1].argmax())
        out.append(nxt)
        seq.append(nxt)
    return out


def test_stateful_greedy_equals_full_forward_argmax(nano_model):
    model = nano_model(chunk_size=16)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 256, n).tolist() for n in (70, 70, 45)]
    got = greedy_answers(model, prompts, max_new_tokens=12, stop_id=None, batch_size=2, chunk_len=32)
    for p, g in zip(prompts, got):
        assert g == _full_forward_greedy(model, p, 12)


def test_passkey_datamodule_rows_and_loss_mask():
    from recurlen.evaluation.tasks.config import load_task_experiment
    from recurlen.evaluation.tasks.datamodules import build_task_datamodule

    cfg = load_task_experiment(["experiment=passkey", "data.seq_len=300", "data.batch_size=4"])
    dm = build_task_datamodule(cfg)
    b = dm.train_batch(5)
    assert b["input_ids"].shape == (4, 300) and b["loss_mask"].dtype == torch.bool
    assert torch.equal(b["input_ids"][:, 1:], b["targets"][:, :-1])
    assert b["new_stream"].all() and torch.equal(b["lane"], torch.arange(4))
    tok = ByteTokenizer()
    for row in range(4):
        masked = b["targets"][row][b["loss_mask"][row]].tolist()
        assert masked[-1] == tok.eos_id and len(masked) == 7  # " 12345" + EOS
        key = tok.decode(masked[:-1]).strip()
        text = tok.decode(b["input_ids"][row].tolist())
        # inputs = prompt + answer (the EOS is only a target): twice in the key sentence, once as the answer
        assert key.isdigit() and len(key) == 5 and text.count(key) == 3
        assert text.endswith("What is the pass key? The pass key is " + key)
    assert all(torch.equal(b[k], dm.train_batch(5)[k]) for k in b)  # a pure function of the step
    assert not torch.equal(b["input_ids"], dm.train_batch(6)["input_ids"])
    val = list(dm.val_dataloader())
    assert len(val) == 4 and not torch.equal(val[0]["input_ids"], b["input_ids"])


def test_tiny_passkey_run_writes_results_heatmap_and_tensorboard(tmp_path, run_tiny_task):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    path = run_tiny_task("passkey", "data.seq_len=256", "data.batch_size=2", "trainer.max_steps=2",
                         "trainer.val_every_n_steps=2", "intervention.fit_batches=1", "task.lengths=[256,320]",
                         "task.trials=2", "task.passkey.depths=[0.2,0.8]")
    assert path == tmp_path / "run" / "passkey" / "results.json"
    res = json.loads(path.read_text())
    assert res["format"] == "recurlen.tasks.passkey/1" and res["train_len"] == 256
    assert res["lengths"] == [256, 320] and res["depths"] == [0.2, 0.8]
    assert len(res["cells"]) == 4 and all(c["trials"] == 2 for c in res["cells"])
    for c in res["cells"]:
        assert c["accuracy"] == c["correct"] / 2 and 0 <= c["non_numeric"] <= 2
    assert np.array(res["accuracy"]).shape == (2, 2)
    png = path.parent / res["plots"]["figure"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 2000
    acc = EventAccumulator(str(path.parent / "tb"), size_guidance={"tensors": 0})
    acc.Reload()
    # Its own section (task/), the x-axis in the tag and in a chart title: the step slot holds the prompt length.
    assert set(acc.Tags()["scalars"]) == {"task/passkey/accuracy_by_prompt_tokens/depth_0.2",
                                          "task/passkey/accuracy_by_prompt_tokens/depth_0.8",
                                          "task/passkey/accuracy_by_prompt_tokens/mean"}
    mean_events = acc.Scalars("task/passkey/accuracy_by_prompt_tokens/mean")
    assert [e.step for e in mean_events] == [256, 320]
    assert [e.value for e in mean_events] == pytest.approx([res["mean_accuracy_by_length"][k] for k in ("256", "320")])
    layout = layout_pb2.Layout()
    layout.ParseFromString(acc.Tensors("custom_scalars__config__")[-1].tensor_proto.string_val[0])
    charts = {c.title: [(ch.title, list(ch.multiline.tag)) for ch in c.chart] for c in layout.category}
    assert charts == {"task: passkey by length": [
        ("passkey: accuracy vs prompt tokens (x axis: prompt tokens, not a training step)",
         ["^task/passkey/accuracy_by_prompt_tokens/"])]}
    assert acc.Tags()["images"] == ["task/passkey/figure"]
    # `recurlen report` reads the task's results.json as it is written.
    from recurlen.commands.report import write_report

    text = write_report([path.parent], out_dir=tmp_path / "report").read_text()
    mean = res["mean_accuracy_by_length"]
    assert f"| run (256) | {mean['256']:.2f} | {mean['320']:.2f} |" in text
    assert (tmp_path / "report" / "passkey_0_run.png").is_file()
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()
    assert (tmp_path / "run" / "fitted_noise.pt").is_file()  # the paper's intervention for passkey ran
