"""RWKV-6's A knob (recurlen.models.timescales) on the kernel path: fla's real chunk_rwkv6 under Triton's interpreter
(make test-kernels) is given s times the log decay, and its logits, final state and the gradient of the scales equal
the PyTorch scan's with the same scale, for a scale that lengthens the memories (s < 1) and one that shortens them
(s > 1). The shared check: tests/models/decay_scale_kernel_checks.py.

Shapes are tiny (the interpreter runs every kernel program in numpy): the nano RWKV-6 (two layers), one lane, a
length that crosses fla's chunk boundary (64), so the scaled decay is carried from chunk to chunk.
"""

import pytest
import torch

from recurlen.models.rwkv6 import RWKV6LM, RWKV6State, preset
from tests.models.decay_scale_kernel_checks import check_scaled_kernel_equals_torch

pytestmark = [pytest.mark.kernels, pytest.mark.usefixtures("fla_rwkv6_interpreter")]

LENGTH = 70  # one full chunk of 64 and a partial one
# tests/models/rwkv6/test_rwkv6_kernels_cpu.py's. Not larger scales at this tolerance: from s ~ 16 the torch path's
# float32 chunked scan is the one that drifts (8e-6 of the logits from the one-token step at s = 16, 2e-5 at 64, where
# fla's kernel stays within 4e-7 of it).
TOL = 1e-5
GRAD_TOL = 1e-4


@pytest.fixture(scope="module")
def unscaled():
    """test_rwkv6_kernels_cpu.py's model with its two layers (log decays from ~-0.02 to ~-1 a token, projections
    larger than the init), its input, an initial state, and its kernel logits without a scale."""
    torch.manual_seed(0)
    model = RWKV6LM(preset("nano"), backend="torch").eval()
    with torch.no_grad():
        for block in model.model.layers:
            block.attn.w_proj.linear.lora[2].bias.uniform_(-4.0, 0.0)
            block.attn.bonus.normal_(0.0, 0.5)
            for proj in (block.attn.r_proj, block.attn.k_proj, block.attn.v_proj):
                proj.linear.weight.mul_(8.0)
    ids = torch.randint(0, 257, (1, LENGTH), generator=torch.Generator().manual_seed(2))
    g = torch.Generator().manual_seed(1)
    init = RWKV6State(*(torch.randn(t.shape, generator=g) * 0.3 for t in model.zero_state(1).parts().values()))
    with torch.no_grad():
        logits, _ = model(ids, init, backend="kernel")
    return model, ids, init, logits


@pytest.mark.parametrize("s", [0.5, 4.0])
def test_scaled_kernel_path_equals_the_scaled_torch_path(unscaled, close_scaled, s):
    model, ids, init, unscaled_logits = unscaled
    check_scaled_kernel_equals_torch(model, ids, init, s, close=close_scaled, recurrent="wkv", tol=TOL,
                                     grad_tol=GRAD_TOL, unscaled_logits=unscaled_logits, what="RWKV-6")
