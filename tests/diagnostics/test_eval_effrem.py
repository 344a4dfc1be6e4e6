"""Effective Remembrance: exact zero at t=0, range, a context-free model, the naive definition; for every
architecture (the `arch` fixture)."""

from __future__ import annotations

import pytest
import torch

from recurlen.diagnostics.effrem import default_t_grid, effective_remembrance, effrem_batch, suffix_tokens

T = 96


@pytest.fixture(scope="module")
def contexts() -> torch.Tensor:
    return torch.randint(0, 257, (3, T + 20), generator=torch.Generator().manual_seed(2))


def naive_effrem(model: torch.nn.Module, ids_T: torch.Tensor, t: int) -> float:
    """The definition, one suffix at a time, each in one forward call."""
    with torch.no_grad():
        p_full = torch.softmax(model(ids_T[None])[0][0, -1].double(), -1)
        p_t = torch.softmax(model(ids_T[None, t:])[0][0, -1].double(), -1)
    return 0.5 * (p_full - p_t).abs().sum().item()


def test_effrem_matches_definition_and_range(arch_model, contexts):
    grid = [0, 1, 17, 50, 64, 95]
    res = effective_remembrance(arch_model, contexts, context_len=T, t_grid=grid, chunk_len=40, max_batch_rows=5)
    mean_G = res.mean()
    assert res.t == grid and res.count == 3
    assert mean_G[0].item() == 0.0  # exactly: the t = 0 suffix is the full-context run itself
    assert ((mean_G >= 0) & (mean_G <= 1)).all()
    assert mean_G[-1] > 0.01  # keeping only x[T-1] really changes the prediction of this model
    for g, t in enumerate(grid):
        want = sum(naive_effrem(arch_model, contexts[i, :T], t) for i in range(3)) / 3
        assert mean_G[g].item() == pytest.approx(want, abs=2e-5)


def test_batching_does_not_change_effrem(arch_model, contexts):
    grid = [5, 30, 70]
    a_GB = effrem_batch(arch_model, contexts[:, :T], grid, chunk_len=1000, max_batch_rows=1000)
    b_GB = effrem_batch(arch_model, contexts[:, :T], grid, chunk_len=13, max_batch_rows=4)
    assert a_GB.shape == (3, 3)
    torch.testing.assert_close(a_GB, b_GB, atol=1e-5, rtol=1e-4)


def test_context_free_model_has_zero_effrem(arch, nano_model, contexts):
    m = nano_model(arch, seed=1)
    with torch.no_grad():  # every block passes its input through: the logits depend on the current token only
        for p in m.layers.parameters():
            p.zero_()
    res = effective_remembrance(m, contexts, context_len=T, num_points=9)
    assert res.t == default_t_grid(T, 9) and res.t[-1] == T - 1
    assert res.mean().abs().max().item() < 1e-6


def test_suffix_tokens():
    assert suffix_tokens(100, [0, 50, 99]) == 100 + 50 + 1
    assert suffix_tokens(100, [50]) == 100 + 50  # the full-context run is always needed


def test_bad_input(arch_model, contexts):
    with pytest.raises(ValueError, match=r"t-grid values \[-1\] lie outside \[0, T\] = \[0, 96\]"):
        effective_remembrance(arch_model, contexts, context_len=T, t_grid=[-1, 5])
    with pytest.raises(ValueError, match=r"t-grid values \[200\] lie outside \[0, T\]"):
        effective_remembrance(arch_model, contexts, context_len=T, t_grid=[0, 200])
    with pytest.raises(ValueError, match=r"t=96 \(= T\) leaves an empty context"):
        effective_remembrance(arch_model, contexts, context_len=T, t_grid=[0, T])
    with pytest.raises(ValueError, match=r"T=96 must be larger than the training context train_len=96"):
        effective_remembrance(arch_model, contexts, context_len=T, train_len=T)
    with pytest.raises(ValueError, match=r"EffRem: need 2 held-out sequence\(s\) of at least 500 tokens; found 0 of 3"):
        effective_remembrance(arch_model, contexts, context_len=500, num_sequences=2)
    with pytest.raises(ValueError, match=r"no recurrent-state API"):
        effective_remembrance(torch.nn.Linear(2, 2), contexts, context_len=T)
