"""Mamba-2's LM beyond the contract every architecture shares (tests/models/test_architectures.py): its state layout,
chunk sizes, config errors, initialisation, padded vocabulary and causal conv."""

import pytest
import torch

from recurlen import Mamba2Config, Mamba2LM, preset


def test_state_layout_and_chunk_size_that_never_changes_the_result(nano_model):
    model = nano_model(ngroups=2, chunk_size=8)
    ids = torch.randint(0, 257, (4, 29), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, state = model(ids)
        model.config.chunk_size = 5  # the chunk size changes the schedule, never the result
        other_logits, other_state = model(ids)
    assert state.ssm.shape == (2, 4, 8, 16, 16) and state.conv.shape == (2, 4, model.config.conv_dim, 3)
    assert state.group_view("ssm").shape == (2, 8, 4 * 16 * 16)  # fitted noise per (layer, head)
    torch.testing.assert_close(other_logits, logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(other_state.ssm, state.ssm, rtol=1e-4, atol=1e-5)


def test_bad_configs_raise_clear_errors():
    with pytest.raises(ValueError, match="unknown Mamba-2 preset 'huge'; allowed"):
        preset("huge")
    with pytest.raises(ValueError, match="divisible by headdim"):
        Mamba2Config(d_model=100, headdim=64)
    with pytest.raises(ValueError, match="A_init_range"):
        Mamba2Config(A_init_range=(0.0, 1.0))


def test_init_follows_mamba_ssm_defaults_and_options():
    torch.manual_seed(0)
    model = Mamba2LM(preset("tiny", n_layer=4))
    mixer = model.backbone.layers[0].mixer
    A = torch.exp(mixer.A_log)
    assert A.min() >= 1.0 and A.max() <= 16.0
    dt = torch.nn.functional.softplus(mixer.dt_bias)
    assert dt.min() >= 1e-4 - 1e-7 and dt.max() <= 0.1 + 1e-6
    assert torch.equal(mixer.D, torch.ones_like(mixer.D))
    assert model.lm_head.weight is model.backbone.embedding.weight
    slow = Mamba2LM(preset("tiny", A_init_range=(0.01, 1.0), A_init_log_uniform=True))
    A_slow = torch.exp(slow.backbone.layers[0].mixer.A_log)
    assert A_slow.min() >= 0.01 - 1e-6 and A_slow.max() <= 1.0 + 1e-6


def test_padded_vocab_rows_are_not_in_logits(nano_model):
    model = nano_model()
    assert model.config.padded_vocab_size == 264
    logits, _ = model(torch.randint(0, 257, (1, 4)))
    assert logits.shape[-1] == 257


def test_causal_conv_matches_conv1d_and_gradcheck():
    # The shift-and-add conv (hand-written backward) against F.conv1d on the same padded input.
    from recurlen.models.mamba2.model import causal_conv

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 9, 5, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(5, 4, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(5, dtype=torch.float64, generator=g, requires_grad=True)
    s = torch.randn(2, 5, 3, dtype=torch.float64, generator=g, requires_grad=True)
    out, new_state = causal_conv(x, w, b, s)
    x_pad = torch.cat([s, x.transpose(1, 2)], dim=2)
    ref = torch.nn.functional.conv1d(x_pad, w.unsqueeze(1), b, groups=5).transpose(1, 2)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(new_state, x_pad[:, :, -3:])
    assert torch.autograd.gradcheck(lambda *a: causal_conv(*a)[0], (x, w, b, s))
