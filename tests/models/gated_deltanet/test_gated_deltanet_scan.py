"""Gated DeltaNet's chunked WY / UT scan against a float64 per-token recurrence (outputs, final state, every
gradient including the initial state's) and against fla-core's own naive recurrence."""

import pytest
import torch
import torch.nn.functional as F

from recurlen.models.gated_deltanet.scan import gated_delta_chunked, gated_delta_step

F64 = torch.float64


def recurrence(q, k, v, g, beta, h0, scale):
    """S_t = exp(g_t) (I - beta_t k_t k_t^T) S_t-1 + beta_t k_t v_t^T, o_t = scale q_t^T S_t, token by token, as
    written in the paper (the transition matrix applied, not the delta form the scan uses)."""
    S, outs = h0, []
    eye = torch.eye(q.shape[-1], dtype=q.dtype)
    for t in range(q.shape[1]):
        kt, bt = k[:, t], beta[:, t, :, None, None]
        transition = torch.exp(g[:, t])[..., None, None] * (eye - bt * kt.unsqueeze(-1) * kt.unsqueeze(-2))
        S = transition @ S + bt * kt.unsqueeze(-1) * v[:, t].unsqueeze(-2)
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t] * scale, S))
    return torch.stack(outs, dim=1), S


def _inputs(batch=2, length=45, heads=3, dk=4, dv=5, seed=0, decay=1.0, dtype=F64):
    """Unit-norm keys (as the layer's L2 norm gives), beta in (0, 2) (allow_neg_eigval's range)."""
    gen = torch.Generator().manual_seed(seed)
    kw = dict(dtype=dtype, generator=gen)
    q = torch.randn(batch, length, heads, dk, **kw)
    k = F.normalize(torch.randn(batch, length, heads, dk, **kw), dim=-1)
    v = torch.randn(batch, length, heads, dv, **kw)
    g = F.logsigmoid(torch.randn(batch, length, heads, **kw)) * decay
    beta = 2 * torch.rand(batch, length, heads, **kw)
    h0 = torch.randn(batch, heads, dk, dv, **kw)
    return [q, k, v, g, beta, h0]


def _loss_grads(fn, inputs, seed=4):
    gen = torch.Generator().manual_seed(seed)
    o, S = fn(*inputs)
    w_o = torch.randn(o.shape, dtype=o.dtype, generator=gen)
    w_s = torch.randn(S.shape, dtype=S.dtype, generator=gen)
    return o, S, torch.autograd.grad((o * w_o).sum() + (S * w_s).sum(), inputs)


def _chunked(chunk_size):
    return lambda q, k, v, g, beta, h0: gated_delta_chunked(q, k, v, g, beta, scale=0.5, chunk_size=chunk_size,
                                                            initial_state_BHKV=h0)


@pytest.mark.parametrize("chunk_size", [1, 5, 16, 64])
@pytest.mark.parametrize("length", [1, 17, 45, 100])
def test_chunked_equals_recurrence_outputs_states_and_all_gradients(chunk_size, length):
    inputs = [t.requires_grad_() for t in _inputs(length=length)]
    o_ref, S_ref, g_ref = _loss_grads(lambda *a: recurrence(*a, scale=0.5), inputs)
    o, S, g = _loss_grads(_chunked(chunk_size), inputs)
    assert o.dtype == F64
    torch.testing.assert_close(o, o_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(S, S_ref, rtol=1e-10, atol=1e-10)
    for name, got, want in zip(("q", "k", "v", "g", "beta", "h0"), g, g_ref):
        assert float(want.abs().max()) > 0, name
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9, msg=f"gradient of {name}")


def test_step_equals_recurrence():
    q, k, v, g, beta, h0 = _inputs(length=23)
    o_ref, S_ref = recurrence(q, k, v, g, beta, h0, scale=0.5)
    S, outs = h0, []
    for t in range(q.shape[1]):
        o, S = gated_delta_step(q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], scale=0.5, state_BHKV=S)
        outs.append(o)
    torch.testing.assert_close(torch.stack(outs, dim=1), o_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(S, S_ref, rtol=1e-12, atol=1e-12)


def test_strong_decays_stay_finite_and_exact_in_float32():
    # Per-step log decays down to ~-40: a chunk of 64 decays by e^-2500, beyond float32's range.
    q, k, v, g, beta, h0 = _inputs(length=130, decay=40.0)
    o64, S64 = recurrence(q, k, v, g, beta, h0, scale=0.5)
    o32, S32 = gated_delta_chunked(*(t.float() for t in (q, k, v, g, beta)), scale=0.5, chunk_size=64,
                                   initial_state_BHKV=h0.float())
    assert torch.isfinite(o32).all()
    torch.testing.assert_close(o32.double(), o64, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(S32.double(), S64, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("chunk_size", [16, 64])
def test_equals_fla_naive_recurrent_gated_delta_rule(chunk_size):
    """fla-core's pure-PyTorch reference (it computes in float32): outputs and final state."""
    naive = pytest.importorskip("fla.ops.gated_delta_rule.naive",
                                reason="fla-core is not installed (make test-kernels installs it)")
    q, k, v, g, beta, h0 = _inputs(length=77, heads=2, dk=8, dv=16, seed=3, dtype=torch.float32)
    o_ref, S_ref = naive.naive_recurrent_gated_delta_rule(q, k, v, beta, g, scale=0.3, initial_state=h0,
                                                          output_final_state=True)
    o, S = gated_delta_chunked(q, k, v, g, beta, scale=0.3, chunk_size=chunk_size, initial_state_BHKV=h0)
    print(f"vs fla's naive recurrence: max |o| error {float((o - o_ref).abs().max()):.2e}, "
          f"state {float((S - S_ref).abs().max()):.2e}")
    torch.testing.assert_close(o, o_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(S, S_ref, rtol=1e-5, atol=1e-5)
