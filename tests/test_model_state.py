"""The contract: state in, final state out; any split of the input gives the same result."""

import pytest
import torch

from recurlen import Mamba2Config, Mamba2LM, RecurrentState, preset
from recurlen.evaluation.generation import greedy_generate


def _model(seed=0, **overrides) -> Mamba2LM:
    torch.manual_seed(seed)
    cfg = preset("nano", **overrides)
    model = Mamba2LM(cfg, backend="torch").eval()
    # Make the SSM remember: slow decays so that the initial state matters over the whole test input.
    with torch.no_grad():
        for block in model.backbone.layers:
            block.mixer.A_log.uniform_(-4.0, 0.0)
    return model


def _run_split(model, ids, cuts, state=None):
    logits, bounds = [], [0, *cuts, ids.shape[1]]
    for a, b in zip(bounds[:-1], bounds[1:]):
        out, state = model(ids[:, a:b], state)
        logits.append(out)
    return torch.cat(logits, dim=1), state


@pytest.mark.parametrize("ngroups", [1, 2])
@pytest.mark.parametrize("cuts", [[64], [1, 2, 3], [5, 70, 71, 130], list(range(1, 40))])
def test_split_invariance(ngroups, cuts):
    model = _model(ngroups=ngroups, chunk_size=16)
    ids = torch.randint(0, 257, (3, 150))
    with torch.no_grad():
        full_logits, full_state = model(ids)
        split_logits, split_state = _run_split(model, ids, cuts)
    torch.testing.assert_close(split_logits, full_logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(split_state.ssm, full_state.ssm, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(split_state.conv, full_state.conv, rtol=1e-5, atol=1e-5)


def test_split_invariance_one_token_pieces_and_chunk_sizes():
    model = _model(chunk_size=8)
    ids = torch.randint(0, 257, (2, 29))
    with torch.no_grad():
        full_logits, full_state = model(ids)
        split_logits, split_state = _run_split(model, ids, list(range(1, 29)))
        model.config.chunk_size = 5  # the chunk size changes the schedule, never the result
        other_logits, _ = model(ids)
    torch.testing.assert_close(split_logits, full_logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(split_state.ssm, full_state.ssm, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(other_logits, full_logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("drop", ["ssm", "conv"])
def test_dropping_either_state_breaks_split_invariance(drop):
    model = _model()
    ids = torch.randint(0, 257, (2, 96))
    with torch.no_grad():
        full_logits, _ = model(ids)
        first, state = model(ids[:, :48])
        if drop == "ssm":
            state = RecurrentState(torch.zeros_like(state.ssm), state.conv)
        else:
            state = RecurrentState(state.ssm, torch.zeros_like(state.conv))
        second, _ = model(ids[:, 48:], state)
    err = (second - full_logits[:, 48:]).abs().max().item()
    assert err > 1e-2, f"dropping the {drop} state changed the logits by only {err}"


def test_step_equals_chunked_forward():
    model = _model(ngroups=2)
    ids = torch.randint(0, 257, (2, 40))
    init = model(ids[:, :7])[1]
    with torch.no_grad():
        full_logits, full_state = model(ids[:, 7:], init)
        state, outs = init, []
        for t in range(7, 40):
            out, state = model.step(ids[:, t], state)
            outs.append(out)
    torch.testing.assert_close(torch.stack(outs, 1), full_logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state.ssm, full_state.ssm, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(state.conv, full_state.conv, rtol=1e-5, atol=1e-5)


def test_greedy_generate_matches_full_forward_argmax():
    model = _model()
    prompt = torch.randint(0, 257, (2, 20))
    gen = greedy_generate(model, prompt, max_new_tokens=8, chunk_len=6)
    seq = prompt
    with torch.no_grad():
        for _ in range(8):
            nxt = model(seq)[0][:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], dim=1)
    assert torch.equal(gen, seq[:, 20:])


def test_gradient_reaches_initial_state_and_matches_finite_differences():
    model = _model(d_model=16, headdim=8, d_state=4, n_layer=2, chunk_size=4).double()
    ids = torch.randint(0, 257, (1, 11))
    base = model.zero_state(1)
    g = torch.Generator().manual_seed(1)
    ssm0 = torch.randn(base.ssm.shape, dtype=torch.float64, generator=g).requires_grad_()
    conv0 = torch.randn(base.conv.shape, dtype=torch.float64, generator=g).requires_grad_()
    w = torch.randn(1, 11, 257, dtype=torch.float64, generator=g)

    def f(ssm, conv):
        logits, state = model(ids, RecurrentState(ssm, conv))
        return (logits * w).sum() + state.ssm.pow(2).sum() * 0.1

    f(ssm0, conv0).backward()
    assert ssm0.grad is not None and ssm0.grad.abs().sum() > 0
    assert conv0.grad is not None and conv0.grad.abs().sum() > 0
    eps = 1e-6
    for tensor, grad in ((ssm0, ssm0.grad), (conv0, conv0.grad)):
        flat = tensor.detach().clone().view(-1)
        for idx in torch.randperm(flat.numel(), generator=g)[:6].tolist():
            plus, minus = flat.clone(), flat.clone()
            plus[idx] += eps
            minus[idx] -= eps
            with torch.no_grad():
                if tensor is ssm0:
                    fd = (f(plus.view_as(ssm0), conv0) - f(minus.view_as(ssm0), conv0)) / (2 * eps)
                else:
                    fd = (f(ssm0, plus.view_as(conv0)) - f(ssm0, minus.view_as(conv0))) / (2 * eps)
            assert grad.view(-1)[idx].item() == pytest.approx(fd.item(), rel=1e-5, abs=1e-7)


def test_state_type_operations():
    model = _model()
    ids = torch.randint(0, 257, (4, 10))
    _, state = model(ids)
    assert state.ssm.shape == (2, 4, 8, 16, 16) and state.ssm.dtype == torch.float32
    assert state.conv.shape == (2, 4, model.config.conv_dim, 3)
    sub = state[torch.tensor([1, 3])]
    assert torch.equal(sub.ssm, state.ssm[:, [1, 3]])
    reset = state.reset(torch.tensor([True, False, False, True]))
    assert reset.ssm[:, [0, 3]].abs().sum() == 0 and torch.equal(reset.ssm[:, 1], state.ssm[:, 1])
    assert reset.conv[:, [0, 3]].abs().sum() == 0
    cat = RecurrentState.cat([state[0:2], state[2:4]])
    assert torch.equal(cat.ssm, state.ssm) and torch.equal(cat.conv, state.conv)
    back = RecurrentState.from_state_dict(state.state_dict())
    assert torch.equal(back.ssm, state.ssm)
    x = state.ssm.clone().requires_grad_()
    assert not RecurrentState(x, state.conv).detach().ssm.requires_grad
    # Reset lanes restart exactly like fresh sequences.
    with torch.no_grad():
        fresh, _ = model(ids[:, :5])
        again, _ = model(ids[:, :5], state.reset(torch.ones(4, dtype=torch.bool)))
    torch.testing.assert_close(again, fresh, rtol=0, atol=0)


def test_bad_inputs_raise_clear_errors():
    model = _model()
    ids = torch.randint(0, 257, (2, 8))
    state = model.zero_state(2)
    with pytest.raises(ValueError, match=r"state.ssm has shape .* need"):
        model(ids, model.zero_state(3))
    with pytest.raises(ValueError, match="float32"):
        model(ids, RecurrentState(state.ssm.half(), state.conv))
    with pytest.raises(ValueError, match="state.conv has shape"):
        model(ids, RecurrentState(state.ssm, state.conv[..., :2]))
    with pytest.raises(ValueError, match="RecurrentState or None"):
        model(ids, (state.ssm, state.conv))
    with pytest.raises(ValueError, match="input_ids must be an integer tensor"):
        model(ids.float())
    with pytest.raises(ValueError, match="unknown backend 'cuda'; allowed"):
        model(ids, backend="cuda")
    with pytest.raises(ValueError, match="unknown backend"):
        Mamba2LM(preset("nano"), backend="triton")
    with pytest.raises(ValueError, match="backend='kernel' needs"):
        model(ids, backend="kernel")
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


def test_padded_vocab_rows_are_not_in_logits():
    model = _model()
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
