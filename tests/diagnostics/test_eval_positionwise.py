"""Position-wise evaluation: chunked == unchunked, the reset control, bins, bad input; the oracles for every
architecture (the `arch` fixture)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from recurlen.diagnostics.bins import bin_sums, context_bins, log_bins, split_points
from recurlen.diagnostics.positionwise import evaluate_positionwise, evaluation_ends, score_positions

L = 256
T = 32


@pytest.fixture(scope="module")
def seqs() -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 257, (3, L), generator=g)


def full_nll(model: torch.nn.Module, ids_BL: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        logits, _ = model(ids_BL)
    return F.cross_entropy(logits[:, :-1].transpose(1, 2), ids_BL[:, 1:], reduction="none")


@pytest.mark.parametrize("chunk_len", [37, 100, 255])
def test_chunked_nll_equals_one_forward(arch_model, seqs, chunk_len):
    ref_BP = full_nll(arch_model, seqs)
    ends = split_points(L, chunk_len=chunk_len)
    assert any(e % chunk_len == 0 for e in ends[:-1]) and L % chunk_len != 0
    nll_BP, _ = score_positions(arch_model, seqs, ends=ends)
    assert nll_BP.shape == (3, L - 1)
    assert torch.isfinite(nll_BP).all()
    torch.testing.assert_close(nll_BP, ref_BP, atol=2e-5, rtol=1e-5)
    # The first token of every chunk is predicted from the previous chunk's last logits (position
    # end - 1), and the chunk's own first prediction (position end) starts from the carried state.
    at = [p for end in ends[:-1] for p in (end - 1, end) if p < L - 1]
    assert at
    torch.testing.assert_close(nll_BP[:, at], ref_BP[:, at], atol=2e-5, rtol=1e-5)


def test_lm_head_slices_do_not_change_nll(arch_model, seqs, monkeypatch):
    import recurlen.diagnostics.positionwise as positionwise

    monkeypatch.setattr(positionwise, "HEAD_ELEMENTS", 3 * 257 * 7)  # 7 positions per LM-head call
    nll_BP, _ = score_positions(arch_model, seqs, ends=[37, 100, L])
    torch.testing.assert_close(nll_BP, full_nll(arch_model, seqs), atol=2e-5, rtol=1e-5)


def test_forward_calls_capped_do_not_change_nll(arch_model, seqs, monkeypatch):
    import recurlen.diagnostics.positionwise as positionwise

    width = arch_model.embedding.embedding_dim
    monkeypatch.setattr(positionwise, "FORWARD_ELEMENTS", 3 * width * 64)  # 64 tokens per call
    assert positionwise.forward_tokens_per_call(arch_model, 3) == 64
    nll_BP, _ = score_positions(arch_model, seqs, ends=[37, 200, L])  # chunks of 37, 163 and 56 tokens
    torch.testing.assert_close(nll_BP, full_nll(arch_model, seqs), atol=2e-5, rtol=1e-5)


def test_memory_per_call_does_not_grow_with_length(nano_model, monkeypatch):
    """Constant memory in L, structurally: the largest forward call and the LM head's largest logits tensor are
    the same size for a short and a long sequence (the head's at most 64 MiB in float32).

    The regressions this catches: head slices as large as a whole chunk made the peak follow the longest chunk;
    forward calls as long as a chunk did the same, since the state-sampling points cut a short sequence into
    shorter chunks than a long one (at the 130m shape a 128k-token evaluation peaked 1.52x above a 4k one).
    """
    import recurlen.diagnostics.positionwise as positionwise

    big_vocab = nano_model("mamba2", vocab_size=50277)  # a Pile-sized LM head
    chunk_len = 1024

    def largest_calls(length: int) -> tuple[int, int]:
        forward_tokens, head_elements = [], []
        forward_hidden, logits_from_hidden = big_vocab.forward_hidden, big_vocab.logits_from_hidden

        def spy_forward(ids_BL, state=None, **kw):
            forward_tokens.append(ids_BL.numel())
            return forward_hidden(ids_BL, state, **kw)

        def spy_head(hidden):
            logits = logits_from_hidden(hidden)
            head_elements.append(logits.numel())
            return logits

        big_vocab.forward_hidden, big_vocab.logits_from_hidden = spy_forward, spy_head
        try:
            ids = torch.randint(0, 50277, (1, length), generator=torch.Generator().manual_seed(2))
            evaluate_positionwise(big_vocab, ids, train_len=chunk_len, chunk_len=chunk_len, batch_size=1,
                                  reset_control=False)
        finally:
            del big_vocab.forward_hidden, big_vocab.logits_from_hidden
        return max(forward_tokens), max(head_elements)

    monkeypatch.setattr(positionwise, "FORWARD_ELEMENTS", 0)  # no cap: calls of whole chunks
    uncapped = largest_calls(4 * chunk_len), largest_calls(8 * chunk_len)
    assert uncapped[0][0] < chunk_len and uncapped[1][0] == chunk_len  # state points cut the short one finer
    # The cap at this tiny width, scaled to what 2^19 is at the 130m shape (a quarter of a 2048-token chunk).
    monkeypatch.setattr(positionwise, "FORWARD_ELEMENTS", big_vocab.config.d_model * chunk_len // 4)
    per_call = positionwise.forward_tokens_per_call(big_vocab, 1)
    short, long = largest_calls(4 * chunk_len), largest_calls(8 * chunk_len)
    assert short[0] == long[0] == per_call < chunk_len
    assert short[1] == long[1] <= (64 << 20) // 4


def test_evaluate_positionwise_sums_and_bins(arch_model, seqs):
    res = evaluate_positionwise(arch_model, seqs, train_len=T, chunk_len=50, batch_size=2, state_stats=False)
    ref_BP = full_nll(arch_model, seqs).double()
    torch.testing.assert_close(res.nll_sum_P, ref_BP.sum(0), atol=1e-4, rtol=1e-5)
    summary = res.summary(num_log_bins=6)
    names = [b["name"] for b in summary["bins"]]
    assert names == ["[0,T)", "[T,2T)", "[2T,4T)", "[4T,8T)"]
    last = summary["bins"][-1]
    assert (last["start"], last["end"], last["count"]) == (4 * T, L - 1, 3 * (L - 1 - 4 * T))
    want = ref_BP[:, T:2 * T].mean().item()
    assert summary["bins"][1]["loss"] == pytest.approx(want, rel=1e-5)
    assert summary["bins"][1]["ppl"] == pytest.approx(math.exp(want), rel=1e-5)
    # log bins partition the positions
    assert sum(b["count"] for b in summary["log_bins"]) == 3 * (L - 1)


def test_reset_control_matches_independent_segments(arch_model, seqs):
    res = evaluate_positionwise(arch_model, seqs, train_len=T, chunk_len=40, state_stats=False)
    full_P = res.nll_sum_P
    reset_P = res.reset_nll_sum_P
    # In-distribution bin [0, T): the reset pass is the full pass.
    torch.testing.assert_close(reset_P[:T], full_P[:T], atol=0, rtol=0)
    # Past T the state is zeroed every T tokens: each segment scored on its own from the zero state.
    for k in range(L // T):
        seg = seqs[:, k * T:(k + 1) * T + 1]  # + 1: the segment's last position predicts the next token
        want_P = full_nll(arch_model, seg).double().sum(0)
        torch.testing.assert_close(reset_P[k * T:k * T + want_P.shape[0]], want_P, atol=1e-4, rtol=1e-5)
    assert (reset_P[T:] - full_P[T:]).abs().max() > 1e-4  # the control really differs beyond T
    rows = res.summary(num_log_bins=0)["bins"]
    assert rows[0]["full_minus_reset"] == 0.0
    assert rows[2]["full_minus_reset"] == pytest.approx(rows[2]["loss"] - rows[2]["reset_loss"])


def test_chunk_len_does_not_change_results(arch_model, seqs):
    a = evaluate_positionwise(arch_model, seqs, train_len=T, chunk_len=64, state_points=4)
    b = evaluate_positionwise(arch_model, seqs, train_len=T, chunk_len=33, state_points=9)
    torch.testing.assert_close(a.nll_sum_P, b.nll_sum_P, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(a.reset_nll_sum_P, b.reset_nll_sum_P, atol=1e-4, rtol=1e-5)


def test_bins():
    bins = context_bins(100, 1000)
    assert [(b.name, b.start, b.end) for b in bins] == [
        ("[0,T)", 0, 100), ("[T,2T)", 100, 200), ("[2T,4T)", 200, 400), ("[4T,8T)", 400, 800),
        ("[8T,16T)", 800, 1000)]
    lb = log_bins(1000, 8)
    assert lb[0].start == 0 and lb[-1].end == 1000
    assert all(a.end == b.start for a, b in zip(lb, lb[1:]))
    assert bin_sums(torch.ones(1000), lb).sum() == 1000
    ends = evaluation_ends(1000, train_len=100, chunk_len=300, state_points=5)
    assert ends[-1] == 1000 and ends == sorted(set(ends))
    assert {300, 600, 900, 100, 200, 800, 1} <= set(ends)


def test_bad_input(arch_model, seqs):
    with pytest.raises(ValueError, match=r"seq_len=32 must be larger than the training context train_len=32"):
        evaluate_positionwise(arch_model, seqs[:, :32], train_len=T)
    with pytest.raises(ValueError, match=r"need 3 held-out sequence\(s\) of at least 512 tokens; found 0 of 3 "
                                         r"\(the longest has 256 tokens\)"):
        evaluate_positionwise(arch_model, seqs, train_len=T, seq_len=512, num_sequences=3)
    short = [seqs[0], seqs[1, :100], seqs[2]]
    with pytest.raises(ValueError, match=r"need 3 held-out sequence\(s\) of at least 200 tokens; found 2 of 3"):
        evaluate_positionwise(arch_model, short, train_len=T, seq_len=200, num_sequences=3)
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 257\)"):
        evaluate_positionwise(arch_model, seqs + 1000, train_len=T)
    with pytest.raises(ValueError, match=r"no recurrent-state API"):
        evaluate_positionwise(torch.nn.Linear(4, 4), seqs, train_len=T)
    with pytest.raises(ValueError, match=r"reset_every=32 needs a chunk end at every multiple"):
        score_positions(arch_model, seqs, ends=[100, L], reset_every=T)


def test_per_sequence_losses_and_their_interval(nano_model, seqs):
    """Each sequence's bin means average to the bin's loss; the interval is the paired bootstrap of their
    differences, reproducible from the per-sequence numbers the summary keeps."""
    from recurlen.diagnostics.intervals import paired_bootstrap

    model = nano_model("mamba2")
    res = evaluate_positionwise(model, seqs, train_len=T, chunk_len=64, batch_size=2, state_stats=False)
    summary = res.summary(num_log_bins=0, seed=3)
    per_seq = summary["per_sequence"]
    assert per_seq["bins"] == [r["name"] for r in summary["bins"]]
    assert len(per_seq["loss"]) == len(per_seq["reset_loss"]) == 3
    ref_BP = full_nll(model, seqs).double()
    for k, row in enumerate(summary["bins"]):
        want = [ref_BP[i, row["start"]:row["end"]].mean().item() for i in range(3)]
        assert [s[k] for s in per_seq["loss"]] == pytest.approx(want, rel=1e-5)
        assert sum(s[k] for s in per_seq["loss"]) / 3 == pytest.approx(row["loss"], rel=1e-9)
    diff = np.array(per_seq["loss"]) - np.array(per_seq["reset_loss"])
    lo, hi = paired_bootstrap(diff, seed=3)
    for k, row in enumerate(summary["bins"]):
        assert row["full_minus_reset_ci"] == [pytest.approx(lo[k]), pytest.approx(hi[k])]
        assert row["full_minus_reset_ci"][0] <= row["full_minus_reset"] + 1e-12
        assert row["full_minus_reset"] - 1e-12 <= row["full_minus_reset_ci"][1]
    assert summary["bins"][0]["full_minus_reset_ci"] == [0.0, 0.0]  # [0,T): the reset changes nothing
    assert summary["interval"] == {"method": "paired bootstrap over held-out sequences (percentile)",
                                   "level": 0.95, "resamples": 2000, "seed": 3, "sequences": 3}
    # The same tokens give the same digest; other tokens another.
    again = evaluate_positionwise(model, seqs[:, :], train_len=T, chunk_len=32, state_stats=False, reset_control=False)
    assert again.sequences_digest == res.sequences_digest
    assert evaluate_positionwise(model, seqs.flip(0), train_len=T, reset_control=False,
                                 state_stats=False).sequences_digest != res.sequences_digest
    assert "reset_loss" not in again.summary(num_log_bins=0)["per_sequence"]
