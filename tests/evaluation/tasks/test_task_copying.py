"""Synthetic copying: the reference's format, both metrics on both readings, the seed summary, and a tiny sweep
through the normal training path."""

import json

import numpy as np
import pytest
import torch

from recurlen.evaluation.tasks.common import rows_from_examples
from recurlen.evaluation.tasks.config import CopyingConfig
from recurlen.evaluation.tasks.copying import (
    CopyingFormat,
    Placed,
    char_accuracy,
    evaluate_single,
    evaluate_stream,
    headline_length,
    summarize,
)
from recurlen.util.tokenizers import ByteTokenizer


class Copier(torch.nn.Module):
    """A model with the recurrent-model API whose "state" is the token history (B, t).

    mode 'perfect' predicts every copy symbol and the end marker; 'silent' always predicts the end marker (a
    model that outputs nothing); 'previous' copies the example before the current one (right format, wrong
    example: catches scoring that looks at the wrong offsets)."""

    def __init__(self, fmt: CopyingFormat, vocab: int, mode: str) -> None:
        super().__init__()
        self.fmt, self.vocab, self.mode = fmt, vocab, mode
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # gives the model a device

    def _next(self, hist: list[int]) -> int:
        f = self.fmt
        if self.mode == "silent":
            return f.end_id
        starts = [i for i, t in enumerate(hist) if t == f.start_id]
        if not starts or f.sep_id not in hist[starts[-1]:]:
            return f.pad_id
        i = starts[-1]
        j = hist.index(f.sep_id, i)
        done = len(hist) - j - 1
        s = hist[i + 1:j]
        if self.mode == "previous":
            s = hist[starts[-2] + 1:hist.index(f.sep_id, starts[-2])] if len(starts) > 1 else []
        return s[done] if done < len(s) else f.end_id

    def forward_hidden(self, ids_BL, state=None):
        hist = torch.zeros(ids_BL.shape[0], 0, dtype=torch.long) if state is None else state
        out = torch.zeros(*ids_BL.shape, self.vocab)
        for t in range(ids_BL.shape[1]):
            hist = torch.cat([hist, ids_BL[:, t:t + 1].cpu()], dim=1)
            for b in range(ids_BL.shape[0]):
                out[b, t, self._next(hist[b].tolist())] = 1.0
        return out, hist

    def logits_from_hidden(self, hidden):
        return hidden

    def forward(self, ids_BL, state=None):
        return self.forward_hidden(ids_BL, state)

    def step(self, ids_B, state=None):
        hidden, state = self.forward_hidden(ids_B[:, None], state)
        return hidden[:, -1], state


def _fmt(**kw) -> CopyingFormat:
    return CopyingFormat(ByteTokenizer(), CopyingConfig(**{"length": 6, "min_length": 2, "alphabet_size": 5, **kw}))


def test_examples_are_start_string_separator_copy_end_with_star_padding():
    tok = ByteTokenizer()
    fmt = CopyingFormat(tok, CopyingConfig(length=10, min_length=3, alphabet_size=4))
    lengths = set()
    for seed in range(200):
        ex = fmt.training_example(np.random.default_rng(seed), seq_len=22)
        text = tok.decode(ex.ids)
        assert text[0] == "$" and text[-1] == "." and text.count("|") == 1
        s, copy = text[1:-1].split("|")
        assert s == copy and set(s) <= set("abcd")
        assert ex.answer_start == len(s) + 2 and len(ex.ids) == 2 * len(s) + 3
        lengths.add(len(s))
    assert lengths == set(range(3, 11))  # uniform over min_length..n: every length shows up
    ex = fmt.training_example(np.random.default_rng(0), seq_len=22)
    batch = rows_from_examples([ex], seq_len=22, pad_id=fmt.pad_id)
    k = ex.answer_start - 2
    assert tok.decode(batch["input_ids"][0].tolist()).endswith("*")  # `*` padding after the end marker
    # the loss is on the copy and its end marker, never on `$`, the string, `|` or the padding
    assert batch["loss_mask"][0].nonzero().flatten().tolist() == list(range(k + 1, 2 * k + 2))
    assert tok.decode(batch["targets"][0][batch["loss_mask"][0]].tolist()) == tok.decode(ex.ids[1:k + 1]) + "."
    with pytest.raises(ValueError, match=r"data.seq_len=20 is too short for copying strings of length 10.*>= 22"):
        fmt.training_example(np.random.default_rng(0), seq_len=20)


def test_packed_rows_hold_examples_back_to_back_and_score_only_complete_copies():
    tok = ByteTokenizer()
    fmt = CopyingFormat(tok, CopyingConfig(length=5, min_length=1, alphabet_size=3, packed=True))
    for seed in range(20):
        ex = fmt.training_example(np.random.default_rng(seed), seq_len=40)
        assert len(ex.ids) == 41
        batch = rows_from_examples([ex], seq_len=40, pad_id=fmt.pad_id)
        text = tok.decode(batch["input_ids"][0].tolist() + [batch["targets"][0, -1].item()])
        complete = text.split(".")[:-1]  # every example that ends inside the row
        assert len(complete) >= 3 and all(e[0] == "$" and e[1:].split("|")[0] == e[1:].split("|")[1]
                                          for e in complete)
        scored = tok.decode(batch["targets"][0][batch["loss_mask"][0]].tolist())
        assert scored == "".join(e.split("|")[1] + "." for e in complete)  # the cut example is not scored


def test_perfect_model_scores_one_silent_model_zero_on_both_readings_and_metrics():
    fmt = _fmt()
    vocab = 256
    res = {}
    for mode in ("perfect", "silent", "previous"):
        model = Copier(fmt, vocab, mode)
        single = evaluate_single(model, fmt, lengths=[6, 18], trials=3, seed=0, batch_size=2, chunk_len=5)
        stream = evaluate_stream(model, fmt, seq_len=14, trials=3, seed=0, batch_size=2, chunk_len=7)
        res[mode] = (single, stream)
    single, stream = res["perfect"]
    assert single["char_acc"] == {"6": 1.0, "18": 1.0} and single["greedy_char_acc"] == {"6": 1.0, "18": 1.0}
    assert single["exact_match"] == {"6": 1.0, "18": 1.0}
    assert stream["char_acc"] == 1.0 and stream["greedy_char_acc"] == 1.0 and stream["examples"] >= 3
    assert stream["score_from"] == 42 and stream["min_length"] >= 56
    single, stream = res["silent"]
    assert single["char_acc"] == {"6": 0.0, "18": 0.0} and single["greedy_char_acc"] == {"6": 0.0, "18": 0.0}
    assert stream["char_acc"] == 0.0 and stream["greedy_char_acc"] == 0.0
    # Copying the previous example of the stream is the right format at the wrong offset: near chance (1/5).
    _, stream = res["previous"]
    assert stream["char_acc"] < 0.5 and stream["greedy_char_acc"] < 0.5


def test_stream_layout_reads_training_rows_one_after_another():
    for packed in (False, True):
        fmt = _fmt(packed=packed)
        placed, total = fmt.stream_layout(np.random.default_rng(3), seq_len=14, factor=4)
        assert total >= 56 and placed[0].start == 0 and placed[-1].end <= total
        starts = [p.start for p in placed]
        if packed:  # back to back
            assert all(p.end == q.start for p, q in zip(placed, placed[1:]))
        else:  # one example per training row of seq_len + 1 tokens, `*` after it
            assert starts == [15 * i for i in range(len(placed))]
        assert any(s >= 42 for s in starts)
        row = fmt.fill(placed, total, [np.full(p.k, fmt.symbol_ids[0]) for p in placed])
        assert row[placed[1].start] == fmt.start_id and row[placed[0].end - 1] == fmt.end_id


def test_char_accuracy_and_errors():
    assert char_accuracy([1, 2, 3, 4], [1, 2, 3, 4]) == 1.0
    assert char_accuracy([1, 9, 3, 9], [1, 2, 3, 4]) == 0.5
    assert char_accuracy([1, 2], [1, 2, 3, 4]) == 0.5  # stopped early: the missing positions are wrong
    assert char_accuracy([2, 3, 4, 5], [1, 2, 3, 4]) == 0.0  # shifted by one is wrong everywhere
    with pytest.raises(ValueError, match="target string is empty"):
        char_accuracy([1], [])
    assert Placed(5, 3).separator == 9 and Placed(5, 3).end == 14


def test_summary_mean_and_sample_std_over_seeds():
    def run(name, seed, a, st):
        single = {"lengths": [8, 24], "char_acc": {"8": 1.0, "24": a}, "greedy_char_acc": {"8": 1.0, "24": a / 2}}
        return {"intervention": name, "seed": seed, "single": single,
                "stream": {"char_acc": st, "greedy_char_acc": st / 2}}

    runs = [run("none", s, a, st) for s, a, st in zip(range(3), [0.2, 0.3, 0.4], [0.1, 0.2, 0.3])]
    runs += [run("state_passing", 0, 0.5, 0.6)]
    out = summarize(runs, headline=24)
    assert out["none"]["at_headline"]["char_acc"] == {"mean": pytest.approx(0.3), "std": pytest.approx(0.1)}
    assert out["none"]["at_headline"]["greedy_char_acc"]["mean"] == pytest.approx(0.15)
    assert out["none"]["stream"]["char_acc"] == {"mean": pytest.approx(0.2), "std": pytest.approx(0.1)}
    assert out["none"]["single"]["char_acc"]["std"]["8"] == 0.0 and out["none"]["seeds"] == [0, 1, 2]
    assert out["state_passing"]["stream"]["greedy_char_acc"] == {"mean": 0.3, "std": 0.0}  # one seed
    assert headline_length([8, 16, 24, 32], n=8, factor=3) == 24
    assert headline_length([8, 20, 30], n=8, factor=3) == 30


def test_config_and_tokenizer_errors(tmp_path):
    from recurlen.evaluation.tasks.config import load_task_experiment

    with pytest.raises(ValueError, match=r"interventions has 'tbptt'; allowed: \['none', 'random_noise'"):
        load_task_experiment(["experiment=copying", "task.copying.interventions=[none,tbptt]"])
    with pytest.raises(ValueError, match="min_length=9 exceeds length=8"):
        load_task_experiment(["experiment=copying", "task.copying.min_length=9"])
    with pytest.raises(ValueError, match="alphabet_size=40 is not allowed; need 2..26"):
        CopyingConfig(alphabet_size=40)
    with pytest.raises(ValueError, match="start / separator / end / pad must differ"):
        CopyingConfig(pad="|")
    with pytest.raises(ValueError, match=r"task.copying.end='x' must be one character that is not a lowercase"):
        CopyingConfig(end="x")
    with pytest.raises(ValueError, match=r"task.copying.stream_factor=1 is not allowed; need an integer >= 2"):
        CopyingConfig(stream_factor=1)


def test_tiny_copying_sweep_trains_each_intervention_through_the_normal_path(tmp_path, run_tiny_task):
    from recurlen.training.run_dir import RUN_META_KEY

    path = run_tiny_task("copying", "data.seq_len=10", "data.batch_size=4", "trainer.max_steps=3",
                         "trainer.val_every_n_steps=3", "task.copying.length=4", "task.copying.seeds=[0]",
                         "task.lengths=[4,12]", "task.trials=4")
    res = json.loads(path.read_text())
    assert res["format"] == "recurlen.tasks.copying/2" and res["headline_length"] == 12
    assert set(res["readings"]) == {"single", "stream"} and set(res["metrics"]) == {"char_acc", "greedy_char_acc"}
    assert [(r["intervention"], r["seed"]) for r in res["runs"]] == [("none", 0), ("state_passing", 0)]
    for r in res["runs"]:
        for m in ("char_acc", "greedy_char_acc"):
            assert set(r["single"][m]) == {"4", "12"} and all(0 <= v <= 1 for v in r["single"][m].values())
            assert 0 <= r["stream"][m] <= 1
        assert r["stream"]["score_from"] == 30 and r["stream"]["examples"] >= 4
        s = res["summary"][r["intervention"]]
        assert s["single"]["char_acc"]["mean"] == r["single"]["char_acc"]
        assert s["at_headline"]["char_acc"]["mean"] == r["single"]["char_acc"]["12"]
        assert s["stream"]["greedy_char_acc"]["mean"] == r["stream"]["greedy_char_acc"]
    assert res["chance"] == pytest.approx(1 / 26)
    assert (path.parent / res["plots"]["figure"]).read_bytes()[:4] == b"\x89PNG"
    from recurlen.commands.report import write_report

    text = write_report([path], out_dir=tmp_path / "report").read_text()
    s = res["summary"]["state_passing"]
    c = s["single"]["char_acc"]
    assert f"| state_passing char_acc | {c['mean']['4']:.3f} +- {c['std']['4']:.3f} | {c['mean']['12']:.3f}" in text
    st = s["stream"]
    assert (f"| state_passing | {st['char_acc']['mean']:.3f} +- 0.000 | {st['greedy_char_acc']['mean']:.3f} +- 0.000 |"
            in text)
    assert "Reading `stream`: zero-state sequences of >= 4 x T = 40 tokens" in text
    # Each run went through run_finetune with its intervention: only state passing carries lane states.
    for name, carries in (("none", False), ("state_passing", True)):
        ckpt = torch.load(tmp_path / "run" / name / "seed0" / "checkpoints" / "last.ckpt", weights_only=True)
        meta = ckpt[RUN_META_KEY]
        assert meta["intervention"] == name and ckpt["global_step"] == 3
        carried = meta["intervention_state"].get("carried")
        assert (carried is not None) == carries
        if carries:
            assert carried["state"]["ssm"].abs().sum() > 0 and carried["state"]["ssm"].shape[1] == 4
