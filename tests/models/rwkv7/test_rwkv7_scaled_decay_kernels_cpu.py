"""RWKV-7's A knob (recurlen.models.timescales) on the kernel path: fla's real chunk_rwkv7 under Triton's interpreter
(make test-kernels) is given s times the log decay, and its logits, final state and the gradient of the scales equal
the PyTorch scan's with the same scale. s < 1 keeps RWKV-7's floor and fla's layer's call (lower_bound = the floor,
chunks of 64); s > 1 moves the bound to s x the floor, and the glue asks for the longest chunk fla's safe_gate scheme
holds for it (kernels.kernel_chunk), each tested near its edge, where the bound on the scheme's exponents is 2^115 to
2^119 of the 2^124 it allows: 64 at s = 4, 32 at s = 8, 16 at s = 15; above ~16 no chunk does, and the time mix runs the
PyTorch scan on the kernel backend too.

The model's log decays reach -0.58 (the floor is -0.61), so at each scale the kernel meets decays close to the bound
it is given. Shapes are tiny (the interpreter runs every kernel program in numpy): hidden 64, 4 heads of 16, 2
layers, one lane, a length that crosses fla's chunk boundary (64). The shared check:
tests/models/decay_scale_kernel_checks.py.
"""

import pytest
import torch

from recurlen.models.rwkv7 import RWKV7LM, RWKV7Config, RWKV7State, kernels
from recurlen.models.rwkv7.scan import LOG_DECAY_FLOOR
from tests.models.decay_scale_kernel_checks import check_scaled_kernel_equals_torch, run_scaled

# The unscaled kernel tests' shapes, tolerances and interpreter fixture (autouse here too).
from tests.models.rwkv7.test_rwkv7_kernels_cpu import (  # noqa: F401 (rwkv7_interpreter: a fixture)
    GRAD_TOL,
    KERNEL_TOL,
    LENGTH,
    NANO,
    rwkv7_interpreter,
)

pytestmark = [pytest.mark.kernels]

@pytest.fixture(scope="module")
def unscaled():
    """tests/models/rwkv7/test_rwkv7_kernels_cpu.py's model (every zero-initialised matrix given random values, k_proj
    without fla's gain 0.1), its input, an initial state, and its kernel logits without a scale."""
    torch.manual_seed(0)
    model = RWKV7LM(RWKV7Config(**NANO), backend="torch").eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2 and float(p.abs().max()) == 0:
                p.normal_(0.0, 0.3)
        for block in model.model.layers:
            block.attn.k_proj.weight.mul_(10.0)
    ids = torch.randint(0, 257, (1, LENGTH), generator=torch.Generator().manual_seed(2))
    g = torch.Generator().manual_seed(1)
    init = RWKV7State(*(torch.randn(t.shape, generator=g) * 0.3 for t in model.zero_state(1).parts().values()))
    with torch.no_grad():
        logits, _ = model(ids, init, backend="kernel")
    return model, ids, init, logits


@pytest.fixture
def kernel_calls(monkeypatch) -> list[dict]:
    """The lower bound and chunk of every call of the glue from now on."""
    calls: list[dict] = []
    glue = kernels.chunk_rwkv7

    def recorded(*args, **kwargs):
        calls.append({"lower_bound": kwargs["lower_bound"], "chunk_size": kwargs["chunk_size"]})
        return glue(*args, **kwargs)

    monkeypatch.setattr(kernels, "chunk_rwkv7", recorded)
    return calls


@pytest.mark.parametrize("s,chunk", [(0.5, 64), (4.0, 64), (8.0, 32), (15.0, 16)])
# fla's centred scheme forms every pair (i, j) of a chunk in one product and keeps the causal ones: beyond RWKV-7's
# floor the discarded ones (j after i, exponents up to |bound| x chunk) overflow to inf, which the interpreter reports.
@pytest.mark.filterwarnings("ignore:overflow encountered in matmul:RuntimeWarning")
def test_scaled_kernel_path_equals_the_scaled_torch_path(unscaled, kernel_calls, close_scaled, s, chunk):
    model, ids, init, unscaled_logits = unscaled
    check_scaled_kernel_equals_torch(model, ids, init, s, close=close_scaled, recurrent="wkv", tol=KERNEL_TOL,
                                     grad_tol=GRAD_TOL, unscaled_logits=unscaled_logits, what="RWKV-7")
    bound = LOG_DECAY_FLOOR * max(s, 1.0)
    # each layer's forward (run_scaled's backward recomputes inside fla, not through the glue), at the bound and chunk
    assert kernel_calls == [{"lower_bound": pytest.approx(bound, rel=1e-6), "chunk_size": chunk}] * 2


def test_above_every_chunk_the_kernel_backend_runs_the_torch_scan(unscaled, kernel_calls):
    """At s = 20 (bound -12.1) not even fla's chunk of 16 keeps its exponents inside float32: fla is not called, and
    the kernel backend is the torch path, bit for bit."""
    model, ids, init, _ = unscaled
    assert kernels.kernel_chunk(LOG_DECAY_FLOOR * 20.0) is None
    ref_logits, ref_state, ref_grad = run_scaled(model, ids, init, 20.0, "torch", "wkv")
    logits, state, grad = run_scaled(model, ids, init, 20.0, "kernel", "wkv")
    assert kernel_calls == []
    assert torch.equal(logits, ref_logits) and torch.equal(grad, ref_grad)
    assert all(torch.equal(getattr(state, name), ref) for name, ref in ref_state.parts().items())
