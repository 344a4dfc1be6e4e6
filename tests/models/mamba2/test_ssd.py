"""The chunked SSD scan against the token-by-token recurrence, in float64."""

import pytest
import torch

from recurlen.models.mamba2.scan import _ChunkDecay, ssd_chunked, ssd_naive


def _inputs(batch=2, length=37, nheads=4, headdim=8, d_state=5, ngroups=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    f64 = dict(dtype=torch.float64, generator=g)
    x = torch.randn(batch, length, nheads, headdim, **f64)
    dt = torch.rand(batch, length, nheads, **f64) * 0.5 + 0.01
    A = -torch.rand(nheads, **f64) * 3 - 0.05
    B = torch.randn(batch, length, ngroups, d_state, **f64)
    C = torch.randn(batch, length, ngroups, d_state, **f64)
    h0 = torch.randn(batch, nheads, headdim, d_state, **f64)
    return x, dt, A, B, C, h0


@pytest.mark.parametrize("ngroups", [1, 2, 4])
@pytest.mark.parametrize("chunk_size", [1, 4, 7, 16, 64])
@pytest.mark.parametrize("length", [1, 13, 37, 64])
def test_chunked_equals_naive_recurrence(ngroups, chunk_size, length):
    x, dt, A, B, C, h0 = _inputs(length=length, ngroups=ngroups)
    y_ref, h_ref = ssd_naive(x, dt, A, B, C, initial_state_BHPN=h0)
    y, h = ssd_chunked(x, dt, A, B, C, chunk_size=chunk_size, initial_state_BHPN=h0)
    assert y.dtype == torch.float64
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(h, h_ref, rtol=1e-10, atol=1e-10)


def test_zero_initial_state_is_default():
    x, dt, A, B, C, _ = _inputs()
    y0, h0 = ssd_chunked(x, dt, A, B, C, chunk_size=8)
    y1, h1 = ssd_chunked(x, dt, A, B, C, chunk_size=8, initial_state_BHPN=torch.zeros_like(h0))
    torch.testing.assert_close(y0, y1, rtol=0, atol=0)
    torch.testing.assert_close(h0, h1, rtol=0, atol=0)


def test_initial_state_matters():
    x, dt, A, B, C, h0 = _inputs()
    y_zero, _ = ssd_chunked(x, dt, A, B, C, chunk_size=8)
    y_init, _ = ssd_chunked(x, dt, A, B, C, chunk_size=8, initial_state_BHPN=h0)
    assert (y_zero - y_init).abs().max() > 1e-3


def test_float32_inputs_computed_in_float32_and_close_to_float64():
    x, dt, A, B, C, h0 = _inputs(length=300)
    y64, h64 = ssd_chunked(x, dt, A, B, C, chunk_size=64, initial_state_BHPN=h0)
    y32, h32 = ssd_chunked(*(t.float() for t in (x, dt, A, B, C)), chunk_size=64, initial_state_BHPN=h0.float())
    assert y32.dtype == torch.float32 and h32.dtype == torch.float32
    torch.testing.assert_close(y32.double(), y64, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(h32.double(), h64, rtol=1e-4, atol=1e-4)


def test_chunk_decay_is_stable_and_masked():
    a = -torch.rand(2, 300, dtype=torch.float64) * 5
    decay = _ChunkDecay.apply(a)
    cs = a.cumsum(-1)
    i, j = 250, 3
    assert decay[0, i, j].item() == pytest.approx(torch.exp(cs[0, i] - cs[0, j]).item(), rel=1e-10)
    assert decay[0, j, i] == 0  # nothing above the diagonal
    assert (torch.diagonal(decay, dim1=-2, dim2=-1) == 1).all()
    # In float32, short segments late in a long chunk stay accurate: the cumulative sums are taken in
    # float64, so their difference does not cancel (cs[i] - cs[j] ~ -600 + 599).
    seg_true = (cs[0, 290] - cs[0, 288]).item()
    decay32 = _ChunkDecay.apply(a.float())[0, 290, 288].double()
    naive32 = torch.exp((a.float().cumsum(-1)[0, 290] - a.float().cumsum(-1)[0, 288]).double())
    truth = torch.exp(torch.tensor(seg_true, dtype=torch.float64))
    assert abs(decay32 - truth) < 1e-6
    assert abs(naive32 - truth) > abs(decay32 - truth)


@pytest.mark.parametrize("ngroups,chunk_size,length", [(1, 8, 37), (2, 16, 64), (4, 5, 13)])
def test_chunked_gradients_equal_naive_gradients(ngroups, chunk_size, length):
    # The chunked scan has a hand-written backward for its decay matrix: every input's gradient,
    # the initial state's included, must match autograd through the plain recurrence.
    inputs = [t.requires_grad_() for t in _inputs(length=length, ngroups=ngroups, seed=3)]
    x, dt, A, B, C, h0 = inputs
    g = torch.Generator().manual_seed(4)
    w_y = torch.randn(x.shape, dtype=torch.float64, generator=g)
    w_h = torch.randn(h0.shape, dtype=torch.float64, generator=g)

    def grads(fn, **kw):
        y, h = fn(x, dt, A, B, C, initial_state_BHPN=h0, **kw)
        return torch.autograd.grad((y * w_y).sum() + (h * w_h).sum(), inputs)

    for got, want in zip(grads(ssd_chunked, chunk_size=chunk_size), grads(ssd_naive)):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


def test_chunked_decay_gradcheck():
    from recurlen.models.mamba2.scan import _ChunkDecay

    a = -torch.rand(2, 3, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 2
    assert torch.autograd.gradcheck(_ChunkDecay.apply, (a.requires_grad_(),))
