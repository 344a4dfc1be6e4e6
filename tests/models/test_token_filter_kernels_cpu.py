"""The token filter (timescales knob "dt_select") on Mamba-2's kernel path, mamba-ssm's real Triton SSD under Triton's
interpreter (make test-kernels): the kernel forms softplus(dt + dt_bias) itself, so a filtered token reaches it as a
finite raw dt whose softplus is 0 (timescales.kernel_dt), with a zero bias; logits and final state must equal the
PyTorch path's with the same filter."""

from __future__ import annotations

import pytest
import torch

from tests.models.test_token_filter import hand_set_filter, ids_for

pytestmark = [pytest.mark.kernels, pytest.mark.usefixtures("triton_interpreter")]


def test_filtered_kernel_path_equals_the_filtered_torch_path(nano_model, close_scaled):
    model = nano_model("mamba2", d_model=32, chunk_size=16)
    ids = ids_for(model, 37, 2)
    hand_set_filter(model, ids)
    with torch.no_grad():
        ref_logits, ref_state = model(ids, backend="torch")
        logits, state = model(ids, backend="kernel")
        plain, _ = nano_model("mamba2", d_model=32, chunk_size=16)(ids, backend="kernel")
    close_scaled(logits, ref_logits, 1e-5, "logits")
    close_scaled(state.ssm, ref_state.ssm, 1e-5, "final SSM state")
    assert (logits - plain).abs().max() > 1e-3  # the filter reached the kernel
