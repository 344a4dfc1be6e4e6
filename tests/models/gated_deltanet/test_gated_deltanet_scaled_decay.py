"""Gated DeltaNet's A knob (recurlen.models.timescales): its scan and its step receive s times the log decay, the scale
before the config's clamp_min (where A_log + log s puts it), and the kernel path: fla's kernel forms
g = -exp(A_log) softplus(a + dt_bias) itself, so a scale s reaches it as A_log + log s. fla's kernel is not run here
(make test-kernels; a GPU): a stand-in computes what the kernel computes from what the glue passes, with recurlen's
PyTorch scan. The shared checks: tests/models/decay_scale_checks.py."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from recurlen.models import timescales
from recurlen.models.gated_deltanet import kernels
from recurlen.models.gated_deltanet import model as gdn_model
from recurlen.models.gated_deltanet.model import l2_normalise
from recurlen.models.gated_deltanet.scan import gated_delta_chunked
from tests.models.decay_scale_checks import (
    check_scale_side_of_clamp,
    check_scan_and_step_receive_s_times_the_log_decay,
    record_log_decays,
)


def test_the_scan_and_the_step_receive_s_times_the_log_decay(nano_model, monkeypatch):
    seen = record_log_decays(monkeypatch, gdn_model, "gated_delta_chunked", "gated_delta_step", 3)
    check_scan_and_step_receive_s_times_the_log_decay(nano_model("gated_deltanet"), seen)


def test_the_scale_comes_before_the_clamp(nano_model, monkeypatch):
    seen = record_log_decays(monkeypatch, gdn_model, "gated_delta_chunked", "gated_delta_step", 3)
    check_scale_side_of_clamp(nano_model("gated_deltanet", clamp_min=-0.1), seen, -0.1, after=False)


@pytest.mark.parametrize("clamp_min", [None, -0.1])
def test_the_kernel_is_given_A_log_plus_log_s_and_computes_the_scaled_model(nano_model, monkeypatch, clamp_min):
    model = nano_model("gated_deltanet", clamp_min=clamp_min)
    cfg = model.config
    given = []

    def stand_in(q, k, v, a, b, *, A_log, dt_bias, scale, allow_neg_eigval, initial_state_BHKV, resets_BL=None,
                 clamp_min=None):
        given.append(A_log)
        g = -torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float())
        g = g if clamp_min is None else g.clamp(min=clamp_min)
        beta = torch.sigmoid(b.float()) * (2 if allow_neg_eigval else 1)
        q, k = (l2_normalise(t.float()).repeat_interleave(cfg.v_groups, dim=-2) for t in (q, k))
        return gated_delta_chunked(q, k, v, g, beta, scale=scale, chunk_size=cfg.chunk_size,
                                   initial_state_BHKV=initial_state_BHKV, resets_BL=resets_BL)

    monkeypatch.setattr(kernels, "chunk_gated_delta_rule", stand_in)
    use = {"kernels": False}
    monkeypatch.setattr(model, "_use_kernels", lambda device, backend: use["kernels"])
    ids = torch.randint(0, 200, (2, 40), generator=torch.Generator().manual_seed(0))
    for scales in (None, torch.tensor([0.5, 3.0])):
        timescales.set_scales(model, "A", scales)
        given.clear()
        with torch.no_grad():
            use["kernels"] = False
            ref, ref_state = model(ids)
            use["kernels"] = True
            got, state = model(ids)
        for mixer, A_log, s in zip(timescales.mixers(model), given, (1.0, 1.0) if scales is None else (0.5, 3.0)):
            if scales is None:
                assert A_log is mixer.A_log  # the parameter itself, as before there were scales
            else:
                torch.testing.assert_close(A_log, mixer.A_log.detach() + math.log(s), atol=1e-6, rtol=0)
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
        torch.testing.assert_close(state.kv, ref_state.kv, atol=1e-5, rtol=0)
