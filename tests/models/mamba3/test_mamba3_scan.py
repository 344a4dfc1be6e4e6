"""Mamba-3's chunked scan against a float64 per-token recurrence written from the paper's equations.

The reference below is independent of recurlen/models/mamba3/scan.py: it turns the rotated pairs as complex numbers
(z * e^{i theta}), keeps the angle unreduced (no mod 2 pi), and steps h_t = alpha_t h_t-1 + beta_t v_t-1 k_t-1^T +
gamma_t v_t k_t^T token by token (Lahoti et al., Mamba-3, exponential-trapezoidal rule with data-dependent RoPE).
"""

import math

import pytest
import torch

from recurlen.models.mamba3.scan import mamba3_chunked, mamba3_step


def reference(q, k, v, adt, dt, trap, angles, q_bias, k_bias, initial):
    """Token by token, float64: y (B, L, H, P) and the final (h, theta, k, v), theta not reduced."""
    batch, length, nheads, headdim = v.shape
    n_angles = angles.shape[-1]
    h, theta, k_prev, v_prev = initial
    r = nheads // q.shape[2]
    ys = []
    for t in range(length):
        theta = theta + math.pi * torch.tanh(angles[:, t]) * dt[:, t, :, None]
        turn = torch.polar(torch.ones_like(theta), theta)  # e^{i theta}, (B, H, S)

        def rot(x_BHN, turn=turn):
            pairs = torch.view_as_complex(x_BHN[..., :2 * n_angles].reshape(*x_BHN.shape[:-1], n_angles, 2)
                                          .contiguous())
            turned = torch.view_as_real(pairs * turn).flatten(-2)
            return torch.cat((turned, x_BHN[..., 2 * n_angles:]), dim=-1)

        q_t = rot(q[:, t].repeat_interleave(r, dim=1) + q_bias)
        k_t = rot(k[:, t].repeat_interleave(r, dim=1) + k_bias)
        alpha = torch.exp(adt[:, t])[..., None, None]
        lam = torch.sigmoid(trap[:, t])[..., None, None]
        d = dt[:, t][..., None, None]
        h = (alpha * h + alpha * d * (1 - lam) * torch.einsum("bhp,bhn->bhpn", v_prev, k_prev)
             + d * lam * torch.einsum("bhp,bhn->bhpn", v[:, t], k_t))
        ys.append(torch.einsum("bhpn,bhn->bhp", h, q_t))
        k_prev, v_prev = k_t, v[:, t]
    return torch.stack(ys, dim=1), (h, theta, k_prev, v_prev)


def inputs(batch=2, length=23, nheads=4, headdim=6, d_state=8, ngroups=2, n_angles=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    f64 = dict(dtype=torch.float64, generator=g)
    q = torch.randn(batch, length, ngroups, d_state, **f64)
    k = torch.randn(batch, length, ngroups, d_state, **f64)
    v = torch.randn(batch, length, nheads, headdim, **f64)
    dt = torch.rand(batch, length, nheads, **f64) * 0.8 + 0.05
    adt = -torch.rand(batch, length, nheads, **f64) * 1.5 * dt
    trap = torch.randn(batch, length, nheads, **f64)
    angles = torch.randn(batch, length, nheads, n_angles, **f64) * 2
    q_bias = torch.randn(nheads, d_state, **f64) * 0.5 + 1
    k_bias = torch.randn(nheads, d_state, **f64) * 0.5 + 1
    initial = (torch.randn(batch, nheads, headdim, d_state, **f64), torch.rand(batch, nheads, n_angles, **f64) * 6,
               torch.randn(batch, nheads, d_state, **f64), torch.randn(batch, nheads, headdim, **f64))
    return [q, k, v, adt, dt, trap, angles, q_bias, k_bias], initial


def wrapped(a, b):
    """Angle difference brought into (-pi, pi]: the scan keeps theta mod 2 pi, the reference does not."""
    return torch.remainder(a - b + math.pi, 2 * math.pi) - math.pi


def rel(got, want):
    return ((got - want).abs().max() / want.abs().max()).item()


@pytest.mark.parametrize("ngroups", [1, 2])
@pytest.mark.parametrize("chunk_size", [1, 5, 8, 64])
@pytest.mark.parametrize("length", [1, 13, 23])
def test_chunked_equals_float64_recurrence(ngroups, chunk_size, length):
    args, initial = inputs(length=length, ngroups=ngroups)
    y_ref, (h_ref, theta_ref, k_ref, v_ref) = reference(*args, initial)
    y, (h, theta, k, v) = mamba3_chunked(*args, chunk_size=chunk_size, initial=initial)
    assert y.dtype == torch.float64
    assert rel(y, y_ref) < 1e-12 and rel(h, h_ref) < 1e-12, (rel(y, y_ref), rel(h, h_ref))
    assert wrapped(theta, theta_ref).abs().max() < 1e-12 and (theta >= 0).all() and (theta < 2 * math.pi).all()
    assert rel(k, k_ref) < 1e-12 and torch.equal(v, v_ref)


def test_without_initial_state_is_the_zero_state():
    args, initial = inputs()
    zeros = tuple(torch.zeros_like(t) for t in initial)
    y0, s0 = mamba3_chunked(*args, chunk_size=8)
    y1, s1 = mamba3_chunked(*args, chunk_size=8, initial=zeros)
    assert torch.equal(y0, y1) and all(torch.equal(a, b) for a, b in zip(s0, s1))


@pytest.mark.parametrize("part", [0, 1, 2, 3])
def test_every_initial_part_reaches_the_outputs(part):
    # A scan that dropped the carried angle, key or value (or the SSM state) would pass the zero-state tests.
    args, initial = inputs()
    changed = list(initial)
    changed[part] = changed[part] + 0.5
    y, _ = mamba3_chunked(*args, chunk_size=8, initial=initial)
    y_changed, _ = mamba3_chunked(*args, chunk_size=8, initial=tuple(changed))
    assert (y - y_changed).abs().max() > 1e-3


@pytest.mark.parametrize("ngroups,chunk_size,length", [(1, 8, 23), (2, 5, 13), (2, 64, 23)])
def test_every_gradient_equals_the_recurrence(ngroups, chunk_size, length):
    args, initial = inputs(length=length, ngroups=ngroups, seed=3)
    leaves = [t.requires_grad_() for t in (*args, *initial)]
    g = torch.Generator().manual_seed(4)
    y_w = torch.randn(args[2].shape, dtype=torch.float64, generator=g)
    state_w = [torch.randn(t.shape, dtype=torch.float64, generator=g) for t in initial]

    def grads(y, state):
        # The final angle enters through cos / sin: its loss is blind to the 2 pi the scan takes off.
        h, theta, k, v = state
        loss = (y * y_w).sum() + (h * state_w[0]).sum() + (torch.sin(theta) * state_w[1]).sum() \
            + (k * state_w[2]).sum() + (v * state_w[3]).sum()
        return torch.autograd.grad(loss, leaves, allow_unused=True)

    want = grads(*reference(*args[:9], tuple(leaves[9:])))
    got = grads(*mamba3_chunked(*leaves[:9], chunk_size=chunk_size, initial=tuple(leaves[9:])))
    names = ["q", "k", "v", "adt", "dt", "trap", "angles", "q_bias", "k_bias", "h0", "theta0", "k0", "v0"]
    for name, a, b in zip(names, got, want):
        assert b is not None and a is not None, name
        assert rel(a, b) < 1e-10, (name, rel(a, b))


def test_step_is_the_recurrence():
    args, initial = inputs(length=9)
    y_ref, state_ref = reference(*args, initial)
    state, ys = initial, []
    for t in range(9):
        y, state = mamba3_step(*(a[:, t] for a in args[:7]), *args[7:], state)
        ys.append(y)
    assert rel(torch.stack(ys, 1), y_ref) < 1e-12 and rel(state[0], state_ref[0]) < 1e-12
    assert wrapped(state[1], state_ref[1]).abs().max() < 1e-12


def test_float32_is_close_to_float64_over_a_long_input():
    args, initial = inputs(length=300, seed=5)
    y64, s64 = mamba3_chunked(*args, chunk_size=64, initial=initial)
    y32, s32 = mamba3_chunked(*(a.float() for a in args), chunk_size=64, initial=tuple(t.float() for t in initial))
    assert y32.dtype == torch.float32 and all(t.dtype == torch.float32 for t in s32)
    assert rel(y32.double(), y64) < 1e-5 and rel(s32[0].double(), s64[0]) < 1e-5
