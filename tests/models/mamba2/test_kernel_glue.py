"""The kernel backend's glue (argument order, layouts, dt handling, states) on CPU, against the torch backend.

mamba-ssm and causal-conv1d need CUDA, so here they are replaced by PyTorch functions with the semantics
and the input requirements their documentation gives (raw dt with dt_bias and softplus inside the scan,
the D skip, gated RMSNorm with norm_before_gate=False, a conv whose initial states need channel-last
layout). The real kernels are compared with the torch backend in tests/models/mamba2/test_gpu_kernels.py.
"""

import pytest
import torch
import torch.nn.functional as F

from recurlen import Mamba2LM, RecurrentState
from recurlen.models import causal_conv
from recurlen.models.mamba2 import kernels
from recurlen.models.mamba2.scan import ssd_naive


def up(t):
    """At least float32, as the kernels compute (float64 stays float64 for a tight comparison)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def fake_scan(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
              dt_softplus=False, dt_limit=(0.0, float("inf")), return_final_states=False):
    # seq_idx (packed rows) is the kernel's own argument; these rows hold one document each.
    assert z is None and seq_idx is None and return_final_states and chunk_size > 0
    dt = up(dt) + up(dt_bias)
    dt = (F.softplus(dt) if dt_softplus else dt).clamp(*dt_limit)
    y, final = ssd_naive(x.double(), dt.double(), A.double(), B.double(), C.double(),
                         initial_state_BHPN=initial_states.double())
    y = y + x.double() * D.double()[:, None]
    return y.to(x.dtype), final.to(initial_states.dtype)


def fake_rmsnorm(x, weight, bias, z=None, eps=1e-6, group_size=None, norm_before_gate=True):
    assert bias is None and not norm_before_gate
    g = (up(x) * F.silu(up(z))).unflatten(-1, (-1, group_size))
    g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + eps)
    return (g.flatten(-2) * up(weight)).to(x.dtype)


def fake_conv(x, weight, bias=None, initial_states=None, return_final_states=False, activation=None):
    # causal-conv1d: initial states only with channel-last x and states, strides multiples of 8.
    assert x.stride(1) == 1 and initial_states.stride(1) == 1, "not channel-last"
    assert x.stride(0) % 8 == 0 and x.stride(2) % 8 == 0, "channel-last strides must be multiples of 8"
    assert activation == "silu" and return_final_states
    width = weight.shape[1]
    x_pad = torch.cat([initial_states.to(x.dtype), x], dim=2)
    out = F.silu(F.conv1d(x_pad, weight.unsqueeze(1), bias, groups=x.shape[1]))
    return out, x_pad[:, :, -(width - 1):]


@pytest.fixture
def fake_kernels(monkeypatch):
    monkeypatch.setattr(kernels, "_mamba_kernels", lambda: ((fake_scan, fake_rmsnorm), None))
    calls = []

    def counted_conv(*args, **kwargs):
        calls.append(args[0].shape)
        return fake_conv(*args, **kwargs)

    monkeypatch.setattr(causal_conv, "_causal_conv1d", lambda: counted_conv)
    monkeypatch.setattr(Mamba2LM, "_use_kernels", lambda self, device, backend: backend == "kernel")
    return calls


@pytest.mark.parametrize("ngroups", [1, 2])
def test_kernel_glue_matches_torch_backend(fake_kernels, nano_model, ngroups):
    model = nano_model(ngroups=ngroups).double()
    ids = torch.randint(0, 257, (2, 37))
    zero = model.zero_state(2)
    g = torch.Generator().manual_seed(1)
    init = RecurrentState(torch.randn(zero.ssm.shape, generator=g, dtype=torch.float64),
                          torch.randn(zero.conv.shape, generator=g, dtype=torch.float64))
    ref_logits, ref_state = model(ids, init, backend="torch")
    logits, state = model(ids, init, backend="kernel")
    torch.testing.assert_close(logits, ref_logits, rtol=1e-9, atol=1e-9)
    assert len(fake_kernels) == model.config.n_layer  # the conv kernel ran in every layer
    # the kernel path returns float32 states (the contract); the float64 torch path keeps float64
    torch.testing.assert_close(state.ssm.double(), ref_state.ssm.double(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(state.conv.double(), ref_state.conv.double(), rtol=1e-6, atol=1e-6)
    # carried across a split through the kernel glue (the state in between is float32)
    a, mid = model(ids[:, :20], init, backend="kernel")
    b, end = model(ids[:, 20:], mid, backend="kernel")
    torch.testing.assert_close(torch.cat([a, b], 1), ref_logits, rtol=1e-5, atol=1e-6)  # via a float32 state
    torch.testing.assert_close(end.ssm.double(), ref_state.ssm.double(), rtol=1e-6, atol=1e-6)


def test_conv_falls_back_when_channels_break_the_stride_rule(fake_kernels):
    x = torch.randn(2, 5, 12)  # 12 channels: not a multiple of 8
    assert causal_conv.causal_conv_kernel(x, torch.randn(12, 4), None, torch.zeros(2, 12, 3)) is None
    out, final = causal_conv.causal_conv_kernel(torch.randn(2, 5, 16), torch.randn(16, 4), None, torch.zeros(2, 16, 3))
    assert out.shape == (2, 5, 16) and final.shape == (2, 16, 3)
