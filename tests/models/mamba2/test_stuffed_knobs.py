"""Mamba-2's Stuffed Mamba knobs (recurlen.models.timescales "B", "decay", "state_norm"): the identity at 1 / None,
what each does to the state, the chunked scan against the token-by-token step with the knobs set, the capped scan's
split invariance and resets, the kernel backend (a B scale keeps the kernel; a decay scale or a cap runs the PyTorch
scan) and the writers' refusal."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from recurlen.models import timescales
from recurlen.models.mamba2 import kernels
from recurlen.models.mamba2 import model as mamba2_model
from recurlen.models.mamba2.scan import ssd_capped, ssd_chunked, ssd_step
from recurlen.util.errors import UserError


def _ids(length: int, seed: int, batch: int = 2) -> torch.Tensor:
    return torch.randint(0, 200, (batch, length), generator=torch.Generator().manual_seed(seed))


def _mixer_state(mixer, u, h0, **knobs):
    """A mixer run on u from h0 (zero conv window) with the knobs set: (chunked state, stepped state)."""
    for name, value in knobs.items():
        setattr(mixer, name, None if value is None else torch.as_tensor(value))
    conv0 = torch.zeros(u.shape[0], mixer.cfg.conv_dim, mixer.cfg.d_conv - 1)
    with torch.no_grad():
        _, chunked, _ = mixer(u, h0, conv0, use_kernels=False)
        stepped, conv = h0, conv0
        for t in range(u.shape[1]):
            _, stepped, conv = mixer.step(u[:, t], stepped, conv)
    for name in knobs:
        setattr(mixer, name, None)
    return chunked, stepped


def test_b_and_decay_scales_of_one_and_no_cap_are_the_model_as_trained(nano_model):
    model = nano_model("mamba2")
    ids = _ids(40, 1)
    with torch.no_grad():
        want, want_state = model(ids)
        timescales.set_scales(model, "B", torch.ones(2))
        timescales.set_scales(model, "decay", torch.ones(2))
        same, same_state = model(ids)
        timescales.set_scales(model, "B", torch.tensor([1.0, 2.0]))
        other_b, _ = model(ids)
        timescales.set_scales(model, "B", None)
        timescales.set_scales(model, "decay", torch.tensor([1.0, 0.9]))
        other_decay, _ = model(ids)
    assert torch.equal(same, want) and torch.equal(same_state.ssm, want_state.ssm)
    assert (other_b - want).abs().max() > 1e-3 and (other_decay - want).abs().max() > 1e-3


def test_a_b_scale_of_two_doubles_the_state_from_a_zero_state(nano_model):
    """From h = 0 the state is a sum of dt x B^T terms: B x 2 doubles it, in the chunked scan and in the step."""
    mixer = timescales.mixers(nano_model("mamba2"))[0]
    u = torch.randn(2, 7, mixer.cfg.d_model, generator=torch.Generator().manual_seed(0))
    h0 = torch.zeros(2, mixer.cfg.nheads, mixer.cfg.headdim, mixer.cfg.d_state)
    plain, plain_step = _mixer_state(mixer, u, h0)
    doubled, doubled_step = _mixer_state(mixer, u, h0, B_scale=2.0)
    assert plain.abs().max() > 1e-3
    torch.testing.assert_close(doubled, 2 * plain, rtol=1e-6, atol=0)
    torch.testing.assert_close(doubled_step, 2 * plain_step, rtol=1e-6, atol=0)


@pytest.mark.parametrize("tokens", [1, 3])
def test_a_decay_scale_multiplies_each_tokens_decay(nano_model, tokens):
    """The part of the state that the initial state h0 leaves after L tokens is prod_t (decay_t) h0 (the state minus
    the one from h = 0, the input being the same): a decay scale s makes it s^L times as large."""
    mixer = timescales.mixers(nano_model("mamba2"))[0]
    g = torch.Generator().manual_seed(1)
    u = torch.randn(2, tokens, mixer.cfg.d_model, generator=g)
    h0 = torch.randn(2, mixer.cfg.nheads, mixer.cfg.headdim, mixer.cfg.d_state, generator=g)
    zero = torch.zeros_like(h0)
    for path in (0, 1):  # the chunked scan, the step
        kept = _mixer_state(mixer, u, h0)[path] - _mixer_state(mixer, u, zero)[path]
        halved = _mixer_state(mixer, u, h0, decay_scale=0.5)[path] - _mixer_state(mixer, u, zero, decay_scale=0.5)[path]
        assert kept.abs().max() > 0.1
        torch.testing.assert_close(halved, 0.5 ** tokens * kept, rtol=1e-4, atol=1e-6)


def test_the_chunked_scan_shifts_real_tokens_only_and_equals_the_step():
    """70 tokens in chunks of 64: 58 padded steps, which must keep decay 1 under a shift (or the final state moves)."""
    g = torch.Generator().manual_seed(2)
    batch, length, heads, headdim, d_state = 2, 70, 4, 3, 5
    x = torch.randn(batch, length, heads, headdim, generator=g)
    dt = torch.rand(batch, length, heads, generator=g) * 0.1
    A = -torch.rand(heads, generator=g)
    B, C = torch.randn(batch, length, 2, d_state, generator=g), torch.randn(batch, length, 2, d_state, generator=g)
    h0 = torch.randn(batch, heads, headdim, d_state, generator=g)
    shift = torch.log(torch.tensor([0.9, 0.99, 1.0, 1.1]))
    y, final = ssd_chunked(x, dt, A, B, C, chunk_size=64, initial_state_BHPN=h0, log_decay_shift=shift)
    state, ys = h0, []
    for t in range(length):
        y_t, state = ssd_step(x[:, t], dt[:, t], A, B[:, t], C[:, t], state, log_decay_shift=shift)
        ys.append(y_t)
    torch.testing.assert_close(y, torch.stack(ys, 1), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(final, state, rtol=1e-4, atol=1e-5)
    # a zero input leaves h0 decayed by prod_t exp(dt_t A + shift) = exp(sum dt A + L shift)
    _, decayed = ssd_chunked(torch.zeros_like(x), dt, A, B, C, chunk_size=64, initial_state_BHPN=h0,
                             log_decay_shift=shift)
    want = torch.exp((dt * A).sum(1) + length * shift)[..., None, None] * h0
    torch.testing.assert_close(decayed, want, rtol=1e-4, atol=1e-7)


def test_the_capped_scan_under_an_unreachable_cap_is_the_chunked_scan_and_a_cap_holds():
    g = torch.Generator().manual_seed(3)
    x, dt = torch.randn(2, 30, 4, 3, generator=g), torch.rand(2, 30, 4, generator=g) * 0.5
    A, B, C = -torch.rand(4, generator=g) * 0.1, torch.randn(2, 30, 1, 5, generator=g), torch.randn(2, 30, 1, 5,
                                                                                                  generator=g)
    y, final = ssd_chunked(x, dt, A, B, C, chunk_size=8)
    y_inf, final_inf = ssd_capped(x, dt, A, B, C, norm_max_H=torch.full((4,), math.inf))
    torch.testing.assert_close(y_inf, y, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(final_inf, final, rtol=1e-4, atol=1e-5)
    cap = torch.tensor([0.5, 1.0, 1e9, 1e9])
    y_cap, final_cap = ssd_capped(x, dt, A, B, C, norm_max_H=cap)
    norms = torch.linalg.vector_norm(final_cap, dim=(-2, -1))
    assert (norms <= cap * (1 + 1e-5)).all() and (norms[:, :2] > cap[:2] * (1 - 1e-5)).all()  # bound, and it binds
    torch.testing.assert_close(final_cap[:, 2:], final[:, 2:], rtol=1e-4, atol=1e-5)  # heads under their caps
    assert (y_cap[:, :, :2] - y[:, :, :2]).abs().max() > 0.1


def _set_all(model, *, cap: float | None = None):
    timescales.set_scales(model, "dt", torch.tensor([0.5, 2.0]))
    timescales.set_scales(model, "A", torch.tensor([3.0, 0.7]))
    timescales.set_scales(model, "B", torch.tensor([0.7, 1.5]))
    timescales.set_scales(model, "decay", torch.tensor([0.9, 0.99]))
    for mixer in timescales.mixers(model):
        mixer.state_norm_max = None if cap is None else torch.full((mixer.cfg.nheads,), cap)


@pytest.mark.parametrize("cap", [None, 0.05])
def test_a_model_with_every_knob_set_steps_as_it_runs_a_sequence(nano_model, step_by_step, cap):
    model = nano_model("mamba2")
    _set_all(model, cap=cap)
    ids = _ids(12, 4)
    with torch.no_grad():
        whole, final = model(ids)
    stepped, stepped_final = step_by_step(model, ids, None)
    torch.testing.assert_close(stepped, whole, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(stepped_final.ssm, final.ssm, atol=1e-5, rtol=1e-4)
    if cap is not None:
        assert torch.linalg.vector_norm(final.ssm, dim=(-2, -1)).max() <= cap * (1 + 1e-5)


def test_a_capped_model_split_in_two_equals_one_call(nano_model, split_equals_one_call):
    model = nano_model("mamba2")
    _set_all(model, cap=0.05)
    ids = _ids(40, 5)
    with torch.no_grad():
        free = torch.linalg.vector_norm(model(ids[:, :20])[1].ssm, dim=(-2, -1))
    assert free.max() > 0.05  # without the cap some head's state is above it: the cap binds
    split_equals_one_call(model, ids, None, cuts=(20,), part_tols={"ssm": 1e-6, "conv": 0.0}, backend="torch")


def test_a_capped_model_restarts_at_a_reset_as_a_fresh_sequence(nano_model):
    model = nano_model("mamba2")
    _set_all(model, cap=0.05)
    ids = _ids(30, 6)
    resets = torch.zeros(2, 30, dtype=torch.bool)
    resets[:, 11] = True
    with torch.no_grad():
        packed, _ = model(ids, resets=resets)
        fresh, _ = model(ids[:, 11:])
    torch.testing.assert_close(packed[:, 11:], fresh, atol=1e-5, rtol=1e-5)


def test_the_kernel_backend_keeps_the_kernel_for_a_b_scale_and_runs_the_torch_scan_for_the_others(
        nano_model, monkeypatch, caplog):
    from tests.models.mamba2.test_kernel_glue import fake_rmsnorm, fake_scan

    calls = []
    monkeypatch.setattr(kernels, "_mamba_kernels",
                        lambda: ((lambda *a, **k: calls.append(1) or fake_scan(*a, **k), fake_rmsnorm), None))
    monkeypatch.setattr(type(nano_model("mamba2")), "_use_kernels", lambda self, device, backend: backend == "kernel")
    model = nano_model("mamba2").double()
    ids = _ids(20, 7)
    timescales.set_scales(model, "B", torch.tensor([0.5, 3.0], dtype=torch.float64))
    with torch.no_grad():
        ref, _ = model(ids, backend="torch")
        got, _ = model(ids, backend="kernel")
    torch.testing.assert_close(got, ref, rtol=1e-9, atol=1e-9)
    assert len(calls) == 2  # the kernel ran in both layers, with the scaled B
    mamba2_model._warn_stuffed_on_torch_scan.cache_clear()
    calls.clear()
    timescales.set_scales(model, "decay", torch.tensor([0.9, 1.0], dtype=torch.float64))
    timescales.mixers(model)[1].state_norm_max = torch.full((model.config.nheads,), 0.05, dtype=torch.float64)
    with caplog.at_level(logging.WARNING, logger=mamba2_model.__name__), torch.no_grad():
        ref, _ = model(ids, backend="torch")
        got, _ = model(ids, backend="kernel")
        model(ids, backend="kernel")
    assert calls == [] and torch.equal(got, ref)
    assert sum("run the PyTorch scan" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize(("knob", "words"), [("B", "has its B scaled (Stuffed Mamba's b_mult)"),
                                             ("decay", "has its decay scaled (Stuffed Mamba's da_mult)"),
                                             ("state_norm", "has its state norm capped")])
def test_a_knob_no_weights_file_holds_is_refused_by_the_writer(nano_model, tmp_path, knob, words):
    model = nano_model("mamba2")
    if knob == "state_norm":
        timescales.mixers(model)[0].state_norm_max = torch.ones(model.config.nheads)
    else:
        timescales.set_scales(model, knob, torch.tensor([1.0, 0.5]))
    with pytest.raises(UserError) as err:
        model.save_pretrained(str(tmp_path / "m"))
    assert words in str(err.value) and "\n" not in str(err.value) and "fixes=[stuffed_mamba]" in str(err.value)
    assert not (tmp_path / "m").exists()
    if knob != "state_norm":
        timescales.set_scales(model, knob, torch.ones(2))  # a scale of 1 is the model as trained: written
        model.save_pretrained(str(tmp_path / "ones"))
        assert (tmp_path / "ones").is_dir()
