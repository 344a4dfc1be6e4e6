"""GLA's A knob (recurlen.models.timescales) on the kernel path: fla's real chunk_gla under Triton's interpreter (make
test-kernels) is given s times the log forget gate, and its logits, final state and the gradient of the scales equal
the PyTorch scan's with the same scale, for a scale that lengthens the memories (s < 1) and one that shortens them
(s > 1: log forget gates down to ~-0.5 a token). The shared check: tests/models/decay_scale_kernel_checks.py.

Shapes are tiny (the interpreter runs every kernel program in numpy): the nano GLA (two layers), one lane, a length
that crosses fla's chunk boundary (64), so the scaled decay is carried from chunk to chunk.
"""

import pytest
import torch

from recurlen.models.gla import GLALM, GLAState
from tests.models.decay_scale_kernel_checks import check_scaled_kernel_equals_torch

pytestmark = [pytest.mark.kernels, pytest.mark.usefixtures("fla_interpreter")]

LENGTH = 77  # one full chunk of 64 and a partial one
TOL = 1e-5  # tests/models/gla/test_gla_kernels_cpu.py's, for the logits, the state and the gradients


@pytest.fixture(scope="module")
def unscaled(nano_model):
    """test_gla_kernels_cpu.py's model (forget gates from ~e^-0.008 to ~e^-0.0002 a token, projections larger than
    the init), its input, an initial state, and its kernel logits without a scale."""
    model: GLALM = nano_model("gla", use_short_conv=False, chunk_size=16)
    with torch.no_grad():
        for block in model.model.layers:
            block.attn.gk_proj[1].bias.uniform_(2.0, 6.0)
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                getattr(block.attn, name).weight.mul_(4.0)
    ids = torch.randint(0, 257, (1, LENGTH), generator=torch.Generator().manual_seed(2))
    zero = model.zero_state(1)
    init = GLAState(torch.randn(zero.kv.shape, generator=torch.Generator().manual_seed(1)) * 0.3, zero.conv)
    with torch.no_grad():
        logits, _ = model(ids, init, backend="kernel")
    return model, ids, init, logits


@pytest.mark.parametrize("s", [0.5, 64.0])
def test_scaled_kernel_path_equals_the_scaled_torch_path(unscaled, close_scaled, s):
    model, ids, init, unscaled_logits = unscaled
    check_scaled_kernel_equals_torch(model, ids, init, s, close=close_scaled, recurrent="kv", tol=TOL, grad_tol=TOL,
                                     unscaled_logits=unscaled_logits, what="GLA")
