"""RWKV-7's chunked WKV scan against a float64 per-token recurrence written from the paper's equations (outputs,
final state, every gradient including the initial state's), at lengths and chunk sizes off each other's grid, at
the strongest decay RWKV-7 allows in float32, and against fla-core's own naive recurrence of the same rule."""

import pytest
import torch
import torch.nn.functional as F

from recurlen.models.rwkv7.config import RWKV7Config
from recurlen.models.rwkv7.scan import LOG_DECAY_FLOOR, wkv7_chunked, wkv7_step

F64 = torch.float64


def recurrence(r, g, k, v, a, b, h0):
    """The paper's wkv_t = wkv_t-1 (diag(w_t) - kappa_t^T (alpha_t kappa_t)) + v_t^T k_t, o_t = wkv_t r_t, token by
    token, in its own value-major layout (wkv: V x K) with the transition matrix applied; here with general a, b
    (the paper's a = -kappa, b = alpha * kappa): wkv_t = wkv_t-1 (diag(w_t) + a_t^T b_t) + v_t^T k_t. Inputs and
    states are key-major as the scan's, transposed at the ends."""
    S = h0.transpose(-1, -2)  # (B, H, V, K)
    outs = []
    for t in range(r.shape[1]):
        transition = torch.diag_embed(torch.exp(g[:, t])) + a[:, t].unsqueeze(-1) * b[:, t].unsqueeze(-2)
        S = S @ transition + v[:, t].unsqueeze(-1) * k[:, t].unsqueeze(-2)
        outs.append((S @ r[:, t].unsqueeze(-1)).squeeze(-1))
    return torch.stack(outs, dim=1), S.transpose(-1, -2)


def _inputs(batch=2, length=45, heads=3, dk=6, dv=5, seed=0, dtype=F64, floor=False):
    """RWKV-7's own ranges: log decays in [-exp(-1/2), 0), a = -kappa (unit norm), b = alpha kappa, alpha in (0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    kw = dict(dtype=dtype, generator=gen)
    r = torch.randn(batch, length, heads, dk, **kw)
    g = LOG_DECAY_FLOOR * (torch.ones(batch, length, heads, dk, dtype=dtype) if floor else
                           torch.sigmoid(2 * torch.randn(batch, length, heads, dk, **kw)))
    k = torch.randn(batch, length, heads, dk, **kw)
    v = torch.randn(batch, length, heads, dv, **kw)
    kappa = F.normalize(torch.randn(batch, length, heads, dk, **kw), dim=-1)
    alpha = torch.rand(batch, length, heads, dk, **kw)
    h0 = torch.randn(batch, heads, dk, dv, **kw)
    return [r, g, k, v, -kappa, kappa * alpha, h0]


def _loss_grads(fn, inputs, seed=4):
    gen = torch.Generator().manual_seed(seed)
    o, S = fn(*inputs)
    w_o = torch.randn(o.shape, dtype=o.dtype, generator=gen)
    w_s = torch.randn(S.shape, dtype=S.dtype, generator=gen)
    return o, S, torch.autograd.grad((o * w_o).sum() + (S * w_s).sum(), inputs)


def _chunked(chunk_size):
    return lambda r, g, k, v, a, b, h0: wkv7_chunked(r, g, k, v, a, b, chunk_size=chunk_size, initial_state_BHKV=h0)


@pytest.mark.parametrize("chunk_size", [1, 5, 16, 64])
@pytest.mark.parametrize("length", [1, 17, 45, 100])
def test_chunked_equals_recurrence_outputs_states_and_all_gradients(chunk_size, length):
    inputs = [t.requires_grad_() for t in _inputs(length=length)]
    o_ref, S_ref, g_ref = _loss_grads(recurrence, inputs)
    o, S, g = _loss_grads(_chunked(chunk_size), inputs)
    assert o.dtype == F64
    torch.testing.assert_close(o, o_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(S, S_ref, rtol=1e-10, atol=1e-10)
    for name, got, want in zip(("r", "g", "k", "v", "a", "b", "h0"), g, g_ref):
        assert float(want.abs().max()) > 0, name
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9, msg=f"gradient of {name}")


def test_step_equals_recurrence():
    r, g, k, v, a, b, h0 = _inputs(length=23)
    o_ref, S_ref = recurrence(r, g, k, v, a, b, h0)
    S, outs = h0, []
    for t in range(r.shape[1]):
        o, S = wkv7_step(r[:, t], g[:, t], k[:, t], v[:, t], a[:, t], b[:, t], state_BHKV=S)
        outs.append(o)
    torch.testing.assert_close(torch.stack(outs, dim=1), o_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(S, S_ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("chunk_size", [32, 64])
def test_the_strongest_decay_stays_exact_in_float32(chunk_size):
    """Every token at RWKV-7's floor exp(-exp(-1/2)): a chunk of 64 decays by e^-38.8; the scan's factors stay
    within e^+-20 and the float32 result within 1e-5 of the float64 recurrence (relative to its largest entry)."""
    *x, h0 = _inputs(length=150, dk=16, dv=16, floor=True)
    o64, S64 = recurrence(*x, h0)
    o32, S32 = wkv7_chunked(*(t.float() for t in x), chunk_size=chunk_size, initial_state_BHKV=h0.float())
    for got, want in ((o32, o64), (S32, S64)):
        assert torch.isfinite(got).all()
        err = float((got.double() - want).abs().max() / want.abs().max())
        assert err < 1e-5, err


def test_config_caps_the_chunk():
    with pytest.raises(ValueError, match="chunk_size=128 is above 64"):
        RWKV7Config(chunk_size=128)


@pytest.mark.parametrize("chunk_size", [16, 64])
def test_equals_fla_naive_dplr_recurrence(chunk_size):
    """fla-core's pure-PyTorch reference of the rule chunk_rwkv7 runs (it computes in float32 and scales the
    queries by K^-1/2, undone here)."""
    naive = pytest.importorskip("fla.ops.generalized_delta_rule.dplr.naive",
                                reason="fla-core is not installed (make test-kernels installs it)")
    r, g, k, v, a, b, h0 = _inputs(length=77, heads=2, dk=16, dv=16, seed=3, dtype=torch.float32)
    head_first = [t.transpose(1, 2) for t in (r, k, v, a, b, g)]
    o_ref, S_ref = naive.dplr_recurrence(head_first[0] * 16 ** 0.5, *head_first[1:], initial_state=h0)
    o, S = wkv7_chunked(r, g, k, v, a, b, chunk_size=chunk_size, initial_state_BHKV=h0)
    print(f"vs fla's naive dplr recurrence: max |o| error {float((o - o_ref.transpose(1, 2)).abs().max()):.2e}, "
          f"state {float((S - S_ref).abs().max()):.2e}")
    torch.testing.assert_close(o, o_ref.transpose(1, 2), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(S, S_ref, rtol=1e-5, atol=1e-5)
