"""The token filter (timescales knob "dt_select", LongMamba's): a token whose dt is not above its channel's threshold
leaves that channel's state exactly as it was, the other channels are untouched, no filter is the model bit for bit,
and the filtered model still runs the same in one call, in pieces, token by token and on the kernel path."""

from __future__ import annotations

import pytest
import torch

from recurlen.models import registry, timescales
from recurlen.util.errors import UserError

FILTERING = [a for a in registry.architectures() if "dt_select" in timescales.knobs(registry.get(a).model_cls)]


def record_dt(model) -> tuple[list[list[torch.Tensor]], list]:
    """Each layer's dt before the filter, one entry per call, read where the mixer forms it (its dt_probe)."""
    seen: list[list[torch.Tensor]] = [[] for _ in timescales.mixers(model)]
    handles = []
    for i, mixer in enumerate(timescales.mixers(model)):
        module, dt_of, _ = mixer.dt_probe()
        handles.append(module.register_forward_hook(lambda _m, _i, out, i=i, f=dt_of: seen[i].append(f(out))))
    return seen, handles


def hand_set_filter(model, ids) -> list[torch.Tensor]:
    """Every other channel global, its threshold in the widest gap between its dt values over `ids` in their middle
    half: between a quarter and three quarters of its tokens filtered, and no dt near the threshold (a dt that
    rounds differently in another path must not land on the other side)."""
    seen, handles = record_dt(model)
    with torch.no_grad():
        model(ids)
    for h in handles:
        h.remove()
    thresholds = []
    for calls in seen:
        dt_NC = torch.cat(calls, dim=1).flatten(0, 1).double().sort(dim=0).values
        n = dt_NC.shape[0]
        middle = dt_NC[n // 4:3 * n // 4]
        widest = (middle[1:] - middle[:-1]).argmax(dim=0, keepdim=True)
        dt_C = ((middle.gather(0, widest) + middle.gather(0, widest + 1)) / 2)[0].to(dt_NC.dtype)
        dt_C[1::2] = 0.0
        thresholds.append(dt_C.float())
    timescales.set_token_filter(model, thresholds)
    return thresholds


def ids_for(model, length: int, seed: int) -> torch.Tensor:
    return torch.randint(0, model.config.vocab_size, (2, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("arch", FILTERING)
def test_no_filter_and_zero_thresholds_are_the_model_bit_for_bit(nano_model, arch, step_by_step):
    model = nano_model(arch)
    ids = ids_for(model, 40, 1)
    with torch.no_grad():
        want, want_state = model(ids)
        channels = [m.dt_probe()[2].numel() for m in timescales.mixers(model)]
        timescales.set_token_filter(model, [torch.zeros(c) for c in channels])
        got, got_state = model(ids)
    assert torch.equal(got, want) and torch.equal(got_state.ssm, want_state.ssm)
    stepped_zero, _ = step_by_step(model, ids[:, :6], None)
    timescales.set_token_filter(model, [None] * len(channels))
    stepped_none, _ = step_by_step(model, ids[:, :6], None)
    assert torch.equal(stepped_zero, stepped_none)


@pytest.mark.parametrize("arch", FILTERING)
def test_a_filtered_token_leaves_the_global_channels_state_as_it_was_and_the_others_untouched(nano_model, arch):
    model, plain = nano_model(arch), nano_model(arch)
    ids = ids_for(model, 24, 2)
    thresholds = hand_set_filter(model, ids)
    seen, handles = record_dt(model)
    state = plain_state = None
    filtered = kept = 0
    with torch.no_grad():
        for t in range(ids.shape[1]):
            before = None if state is None else state.ssm.clone()
            _, state = model.step(ids[:, t], state)
            _, plain_state = plain.step(ids[:, t], plain_state)
            for layer, thr_C in enumerate(thresholds):
                dt_BC = seen[layer][-1]
                off_BC = (thr_C > 0) & (dt_BC <= thr_C)  # global channels whose dt is not above the threshold
                if before is not None:
                    # (layers, batch, channel, ...): the state of a filtered channel is the state before, bit for bit
                    assert torch.equal(state.ssm[layer][off_BC], before[layer][off_BC])
                    on_BC = (thr_C > 0) & ~off_BC
                    assert (state.ssm[layer][on_BC] != before[layer][on_BC]).flatten(1).any(dim=1).all()
                filtered, kept = filtered + int(off_BC.sum()), kept + int(((thr_C > 0) & ~off_BC).sum())
            # layer 0 sees the same input with and without the filter: its local channels are the plain model's
            local = thresholds[0] == 0
            assert torch.equal(state.ssm[0][:, local], plain_state.ssm[0][:, local])
    for h in handles:
        h.remove()
    assert filtered > 100 and kept > 100  # the median splits the tokens
    assert (state.ssm[0][:, ~local] - plain_state.ssm[0][:, ~local]).abs().max() > 1e-3


@pytest.mark.parametrize("arch", FILTERING)
def test_a_filtered_model_runs_alike_in_one_call_in_pieces_and_token_by_token(nano_model, arch, step_by_step,
                                                                              split_equals_one_call, close_scaled):
    model = nano_model(arch)
    ids = ids_for(model, 40, 3)
    hand_set_filter(model, ids)
    with torch.no_grad():
        whole, final = model(ids)
        plain, _ = nano_model(arch)(ids)
    stepped, stepped_final = step_by_step(model, ids, None)
    close_scaled(stepped, whole, 1e-5, "logits, token by token vs one call")
    close_scaled(stepped_final.ssm, final.ssm, 1e-5, "final state, token by token vs one call")
    split_equals_one_call(model, ids, None, cuts=(7, 8, 29), part_tols={"ssm": 1e-5, "conv": 1e-6}, backend="torch")
    assert (whole - plain).abs().max() > 1e-3  # the filter changes the model (100x the tolerance)


def test_mamba1_kernel_path_gives_the_scan_the_filtered_dt(nano_model, monkeypatch, close_scaled):
    """mamba-ssm's CUDA scan (replaced by its documented contract on the CPU) forms softplus(raw + bias) itself: a
    filtered token reaches it as a raw dt whose softplus is exactly 0 (not -inf)."""
    from recurlen.models.mamba1 import kernels
    from tests.models.mamba1.test_mamba1 import reference_selective_scan_fn

    model = nano_model("mamba1")
    ids = ids_for(model, 30, 4)
    hand_set_filter(model, ids)
    with torch.no_grad():
        ref, ref_final = model(ids, backend="torch")
    monkeypatch.setattr(type(model), "_use_kernels", lambda self, device, backend: True)
    monkeypatch.setattr(kernels, "_selective_scan_fn", lambda: (reference_selective_scan_fn, None))
    with torch.no_grad():
        got, final = model(ids)
    close_scaled(got, ref, 1e-5, "logits, kernel path vs torch")
    close_scaled(final.ssm, ref_final.ssm, 1e-5, "final state, kernel path vs torch")
    assert torch.isfinite(timescales.kernel_dt(torch.tensor([0.0, 1e-30, 0.5]))).all()
    assert torch.nn.functional.softplus(timescales.kernel_dt(torch.tensor([0.0]))).item() == 0.0


def test_mamba2_kernel_path_does_not_clamp_a_filtered_dt_back_up(nano_model, monkeypatch):
    """With a dt floor (dt_limit) the kernel would clamp a filtered dt of 0 up to the floor: dt formed outside it
    goes in with no limit. mamba-ssm's Triton scan is replaced by its documented contract (tests/models/mamba2/
    test_kernel_glue.py); make test-kernels runs the real one."""
    from recurlen import Mamba2LM
    from recurlen.models.mamba2 import kernels
    from tests.models.mamba2.test_kernel_glue import fake_rmsnorm, fake_scan

    model = nano_model("mamba2", dt_limit=(0.01, 0.5)).double()
    ids = ids_for(model, 37, 5)
    hand_set_filter(model, ids)
    monkeypatch.setattr(kernels, "_mamba_kernels", lambda: ((fake_scan, fake_rmsnorm), None))
    monkeypatch.setattr(Mamba2LM, "_use_kernels", lambda self, device, backend: backend == "kernel")
    with torch.no_grad():
        ref, ref_final = model(ids, backend="torch")
        got, final = model(ids, backend="kernel")
    torch.testing.assert_close(got, ref, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(final.ssm.double(), ref_final.ssm, rtol=1e-6, atol=1e-6)


def test_thresholds_are_checked_and_a_filtered_model_is_not_written(nano_model, tmp_path):
    model = nano_model("mamba2")
    heads = model.config.nheads
    with pytest.raises(ValueError, match="finite and >= 0"):
        timescales.set_token_filter(model, [torch.full((heads,), float("nan")), None])
    with pytest.raises(ValueError, match="one entry per layer"):
        timescales.set_token_filter(model, [None])
    with pytest.raises(ValueError, match="has no token filter"):
        timescales.set_token_filter(nano_model("gla"), [None, None])
    timescales.set_token_filter(model, [torch.zeros(heads), None])  # filters nothing: written
    model.save_pretrained(str(tmp_path / "zeros"))
    timescales.set_token_filter(model, [torch.full((heads,), 0.01), None])
    with pytest.raises(UserError) as err:
        model.save_pretrained(str(tmp_path / "filtered"))
    assert "\n" not in str(err.value) and "filters tokens in its global channels" in str(err.value)
    assert "fixes=[longmamba]" in str(err.value) and not (tmp_path / "filtered").exists()
