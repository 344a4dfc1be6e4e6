"""RWKV-7 with its log decay scaled by a fix (knob "A", recurlen.models.timescales): its scan and its step receive s
times the log decay, the scale after the config's log_decay_min (shared checks: tests/models/decay_scale_checks.py).
The chunked scan's pair factors are safe only for bounded decays (RWKV-7's floor, -exp(-1/2)), so a scale above 1
shortens the chunk (chunk_for), and the kernel glue asks fla for a chunk its safe_gate scheme holds (kernel_chunk)
or runs the PyTorch scan where none does. fla's kernel itself is not run here (make test-kernels; a GPU): a
stand-in records what the glue passes."""

from __future__ import annotations

import math

import pytest
import torch

from recurlen.models import timescales
from recurlen.models.rwkv7 import kernels
from recurlen.models.rwkv7 import model as rwkv7_model
from recurlen.models.rwkv7.scan import LOG_DECAY_FLOOR, PAIR_EXPONENT, chunk_for, wkv7_chunked
from tests.models.decay_scale_checks import (
    check_scale_side_of_clamp,
    check_scan_and_step_receive_s_times_the_log_decay,
    record_log_decays,
)


def test_the_scan_and_the_step_receive_s_times_the_log_decay(nano_model, monkeypatch):
    seen = record_log_decays(monkeypatch, rwkv7_model, "wkv7_chunked", "wkv7_step", 1)
    check_scan_and_step_receive_s_times_the_log_decay(nano_model("rwkv7"), seen)


def test_the_scale_comes_after_the_clamp(nano_model, monkeypatch):
    seen = record_log_decays(monkeypatch, rwkv7_model, "wkv7_chunked", "wkv7_step", 1)
    check_scale_side_of_clamp(nano_model("rwkv7", log_decay_min=-1e-4), seen, -1e-4, after=True)


def test_chunk_for_keeps_the_pair_exponents_of_rwkv7s_own_floor():
    assert chunk_for(64, LOG_DECAY_FLOOR) == 64 and chunk_for(16, LOG_DECAY_FLOOR) == 16
    assert (chunk_for(64, 2 * LOG_DECAY_FLOOR), chunk_for(64, 4 * LOG_DECAY_FLOOR)) == (31, 15)
    assert chunk_for(64, 40 * LOG_DECAY_FLOOR) == 1 and chunk_for(16, -60.0) == 1
    for s in (1.01, 1.5, 3.0, 7.0, 16.0):
        floor = s * LOG_DECAY_FLOOR
        chunk = chunk_for(64, floor)
        assert -floor * (chunk // 2 + 1) <= PAIR_EXPONENT + 1e-12 < -floor * ((chunk + 2) // 2 + 1)


def test_kernel_chunk_is_fla_layers_64_at_the_floor_and_shorter_for_scaled_decays():
    assert kernels.kernel_chunk(LOG_DECAY_FLOOR) == 64
    assert kernels.kernel_chunk(4 * LOG_DECAY_FLOOR) == 64
    assert kernels.kernel_chunk(5 * LOG_DECAY_FLOOR) == 32
    assert kernels.kernel_chunk(10 * LOG_DECAY_FLOOR) == 16
    assert kernels.kernel_chunk(20 * LOG_DECAY_FLOOR) is None
    for floor in (LOG_DECAY_FLOOR, 4 * LOG_DECAY_FLOOR, 10 * LOG_DECAY_FLOOR):  # inside float32 with headroom
        chunk = kernels.kernel_chunk(floor)
        assert -floor * (chunk // 2 + 1) / math.log(2) <= kernels.EXPONENT_LIMIT_LOG2


@pytest.mark.parametrize("scale", [20.0, 1000.0])
def test_a_strongly_scaled_decay_runs_chunked_as_it_steps(nano_model, step_by_step, scale):
    """s = 20 in chunks of 16 puts pair exponents at 0.61 x 20 x 9 = 109 > float32's 88 (inf x 0 = nan without
    chunk_for); s = 1000 goes below the stop at -60 per token."""
    model = nano_model("rwkv7")
    timescales.set_scales(model, "A", torch.tensor([1.0, scale]))
    ids = torch.randint(0, 200, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        whole, final = model(ids)
    stepped, stepped_final = step_by_step(model, ids, None)
    assert torch.isfinite(whole).all()
    torch.testing.assert_close(stepped, whole, atol=1e-5, rtol=0)
    torch.testing.assert_close(stepped_final.wkv, final.wkv, atol=1e-5, rtol=0)


def test_the_kernel_glue_passes_the_scaled_bound_and_falls_back_beyond_fla(nano_model, monkeypatch):
    """The time mix's kernel branch with a stand-in for fla's op (the PyTorch scan on what the glue passes): at no
    scale the call is fla's layer's (the floor, chunks of 64); a scale moves the bound and shortens the chunk; beyond
    fla's chunks the layer runs the PyTorch scan; the logits are the torch backend's throughout."""
    calls = []

    def stand_in(r, g, k, v, a, b, *, initial_state_BHKV, resets_BL=None, lower_bound, chunk_size):
        calls.append((lower_bound, chunk_size, float(g.min())))
        return wkv7_chunked(r, g, k, v, a, b, chunk_size=chunk_for(16, lower_bound),
                            initial_state_BHKV=initial_state_BHKV, resets_BL=resets_BL)

    monkeypatch.setattr(kernels, "chunk_rwkv7", stand_in)
    model = nano_model("rwkv7")  # chunks of 16 in its PyTorch scan, as the stand-in's
    use = {"kernels": False}
    monkeypatch.setattr(model, "_use_kernels", lambda device, backend: use["kernels"])
    ids = torch.randint(0, 200, (2, 40), generator=torch.Generator().manual_seed(1))
    for scales, want in ((None, [(LOG_DECAY_FLOOR, 64)] * 2),
                         (torch.tensor([0.5, 3.0]), [(LOG_DECAY_FLOOR, 64), (3 * LOG_DECAY_FLOOR, 64)]),
                         (torch.tensor([6.0, 30.0]), [(6 * LOG_DECAY_FLOOR, 32)])):
        timescales.set_scales(model, "A", scales)
        calls.clear()
        with torch.no_grad():
            use["kernels"] = False
            ref, _ = model(ids)
            use["kernels"] = True
            got, _ = model(ids)
        assert [(pytest.approx(lb), c) for lb, c, _ in calls] == want
        assert all(g_min >= lb for lb, _, g_min in calls)  # the bound the glue asserts to fla holds
        assert torch.equal(got, ref)
