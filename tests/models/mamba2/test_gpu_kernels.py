"""Kernel backend (mamba-ssm Triton SSD + causal-conv1d) == PyTorch backend. Skipped without CUDA kernels."""

import pytest
import torch

from recurlen import Mamba2LM, RecurrentState
from recurlen.models import registry
from recurlen.models.mamba2.kernels import kernels_available

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not kernels_available(), reason="needs CUDA and mamba-ssm's kernels"),
]


SMALL = registry.get("mamba2").presets["small"]
"""The small Mamba-2's fields: given to the shared nano factory, they override every field of the nano shape."""


@pytest.fixture
def make_model(nano_model):
    """`make_model(ngroups=1)`: the small Mamba-2 on the GPU, chunks of 64, A drawn away from its init."""

    def build(ngroups: int = 1) -> Mamba2LM:
        model = nano_model("mamba2", **{**SMALL, "ngroups": ngroups, "chunk_size": 64}).cuda()
        with torch.no_grad():
            for block in model.backbone.layers:
                block.mixer.A_log.uniform_(-3.0, 1.0)
        return model

    return build


def _random_state(model, batch):
    g = torch.Generator(device="cuda").manual_seed(3)
    zero = model.zero_state(batch)
    return RecurrentState(torch.randn(zero.ssm.shape, device="cuda", generator=g) * 0.5,
                          torch.randn(zero.conv.shape, device="cuda", generator=g) * 0.5)


@pytest.mark.parametrize("ngroups", [1, 2])
def test_forward_and_final_state_match(make_model, ngroups):
    model = make_model(ngroups)
    ids = torch.randint(0, 257, (2, 300), device="cuda")
    init = _random_state(model, 2)
    with torch.no_grad():
        ref_logits, ref_state = model(ids, init, backend="torch")
        k_logits, k_state = model(ids, init, backend="kernel")
    torch.testing.assert_close(k_logits, ref_logits, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(k_state.ssm, ref_state.ssm, rtol=2e-3, atol=2e-3)
    # Layer 0's window holds in_proj outputs of the embeddings, the same computation on both paths; deeper layers'
    # windows hold inputs that passed earlier layers' scans, so they differ as those layers' outputs do.
    torch.testing.assert_close(k_state.conv[0], ref_state.conv[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k_state.conv, ref_state.conv, rtol=2e-3, atol=2e-3)


def test_backward_and_initial_state_gradients_match(make_model):
    model = make_model()
    ids = torch.randint(0, 257, (2, 200), device="cuda")
    grads = {}
    for backend in ("torch", "kernel"):
        model.zero_grad()
        init = _random_state(model, 2)
        init = RecurrentState(init.ssm.requires_grad_(), init.conv.requires_grad_())
        logits, state = model(ids, init, backend=backend)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 257), ids[:, 1:].reshape(-1))
        (loss + state.ssm.pow(2).mean()).backward()
        grads[backend] = (init.ssm.grad.clone(), init.conv.grad.clone(),
                          model.backbone.layers[0].mixer.in_proj.weight.grad.clone(),
                          model.backbone.layers[1].mixer.A_log.grad.clone())
    for ref, got in zip(grads["torch"], grads["kernel"]):
        torch.testing.assert_close(got, ref, rtol=5e-3, atol=5e-4)


def test_kernel_split_invariance(make_model):
    model = make_model()
    ids = torch.randint(0, 257, (2, 257), device="cuda")
    with torch.no_grad():
        full, full_state = model(ids, backend="kernel")
        a, s = model(ids[:, :100], backend="kernel")
        b, s = model(ids[:, 100:101], s, backend="kernel")
        c, s = model(ids[:, 101:], s, backend="kernel")
    torch.testing.assert_close(torch.cat([a, b, c], 1), full, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(s.ssm, full_state.ssm, rtol=2e-3, atol=2e-3)


def test_bf16_autocast_kernel_close_to_fp32_torch(make_model):
    model = make_model()
    ids = torch.randint(0, 257, (2, 512), device="cuda")
    with torch.no_grad():
        ref, _ = model(ids, backend="torch")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            got, state = model(ids, backend="kernel")
    assert state.ssm.dtype == torch.float32
    assert (got.float().softmax(-1) - ref.softmax(-1)).abs().sum(-1).max() < 0.1
