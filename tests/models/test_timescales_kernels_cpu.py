"""Timescale scales on Mamba-2's kernel path (mamba-ssm's Triton SSD under Triton's interpreter, make test-kernels):
the kernel forms softplus(dt + dt_bias) itself, so a dt scale reaches it as the scaled dt's softplus preimage with
a zero bias; the logits and the final state must equal the PyTorch path's with the same scales."""

from __future__ import annotations

import pytest
import torch

from recurlen.models import timescales

pytestmark = [pytest.mark.kernels, pytest.mark.usefixtures("triton_interpreter")]


@pytest.mark.parametrize("knobs", [("dt",), ("A",), ("dt", "A")])
def test_scaled_kernel_path_equals_the_scaled_torch_path(nano_model, close_scaled, knobs):
    model = nano_model("mamba2", d_model=32, chunk_size=16)
    values = {"dt": torch.tensor([0.3, 4.0]), "A": torch.tensor([5.0, 0.5])}
    for knob in knobs:
        timescales.set_scales(model, knob, values[knob])
    ids = torch.randint(0, 257, (2, 37), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref_logits, ref_state = model(ids, backend="torch")
        logits, state = model(ids, backend="kernel")
        unscaled, _ = nano_model("mamba2", d_model=32, chunk_size=16)(ids, backend="kernel")
    close_scaled(logits, ref_logits, 1e-5, "logits")
    close_scaled(state.ssm, ref_state.ssm, 1e-5, "final SSM state")
    assert (logits - unscaled).abs().max() > 1e-3  # the scales reached the kernel
