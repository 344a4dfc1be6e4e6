"""Gated DeltaNet's A knob (recurlen.models.timescales) on the kernel path: fla's real chunk_gated_delta_rule under
Triton's interpreter (make test-kernels), which forms the decay -exp(A_log) softplus(a + dt_bias) itself, is given
A_log + log s, and its logits, final state and the gradient of the scales equal the PyTorch scan's with the same
scale, for a scale that lengthens the memories (s < 1) and one that shortens them (s > 1); with the config's
clamp_min too (binding at both scales here), where the glue forms the decay (the scale before the clamp) and hands
the kernel its log. The gradient reaches the scales through A_log + log s (fla's dA_log) or through the formed decay.
The shared check: tests/models/decay_scale_kernel_checks.py.

Shapes are tiny (the interpreter runs every kernel program in numpy): hidden 64, 2 layers of 2 heads (key dim 16,
value dim 32), one lane, a length that crosses fla's chunk boundary (64), so the scaled decay is carried from chunk
to chunk.
"""

import pytest
import torch

from tests.models.decay_scale_kernel_checks import check_scaled_kernel_equals_torch

# The unscaled kernel tests' shapes and interpreter fixture (autouse here too).
from tests.models.gated_deltanet.test_gated_deltanet_kernels_cpu import (  # noqa: F401 (a fixture)
    LENGTH,
    gated_delta_interpreter,
    make_model,
    noise_state,
)

pytestmark = [pytest.mark.kernels]

TOL = 1e-5  # tests/models/gated_deltanet/test_gated_deltanet_kernels_cpu.py's (logits, kv; gradients 1e-4)
GRAD_TOL = 1e-4


@pytest.mark.parametrize("s", [0.5, 8.0])
@pytest.mark.parametrize("fields", [{}, dict(clamp_min=-0.002)], ids=["default", "clamped"])
def test_scaled_kernel_path_equals_the_scaled_torch_path(close_scaled, fields, s):
    model = make_model(**fields)
    ids = torch.randint(0, 257, (1, LENGTH), generator=torch.Generator().manual_seed(2))
    init = noise_state(model, 1)
    with torch.no_grad():
        unscaled_logits, _ = model(ids, init, backend="kernel")
    check_scaled_kernel_equals_torch(model, ids, init, s, close=close_scaled, recurrent="kv", tol=TOL,
                                     grad_tol=GRAD_TOL, unscaled_logits=unscaled_logits,
                                     what=f"Gated DeltaNet ({fields or 'default'})")
