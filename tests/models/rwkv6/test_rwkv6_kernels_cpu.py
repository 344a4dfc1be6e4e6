"""RWKV-6 backend="kernel" == backend="torch", with flash-linear-attention's real chunked RWKV-6 kernel executed on
CPU.

The kernel backend here is recurlen's own code, the functions a GPU run calls (recurlen/models/rwkv6/kernels.py and
the time mix's kernel branch), calling fla's `chunk_rwkv6` under Triton's interpreter (the `fla_rwkv6_interpreter`
fixture in conftest.py). The token shifts take the same PyTorch path on both backends.

Shapes are tiny (the interpreter runs every kernel program in numpy): hidden 64, 2 heads of 32 x 32, one layer,
a length that is not a multiple of fla's chunk (64) and, in the split test, cuts inside a chunk.
"""

import pytest
import torch

from recurlen.models.rwkv6 import RWKV6LM, RWKV6State, preset
from recurlen.training.lit_module import token_loss

pytestmark = [pytest.mark.kernels, pytest.mark.usefixtures("fla_rwkv6_interpreter")]

LENGTH = 70  # one full chunk of 64 and a partial one


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    lm = RWKV6LM(preset("nano", num_hidden_layers=1), backend="torch")
    # Slow and fast decays, so that the initial state still matters at the end, and projections larger than the
    # init, so that a swapped or dropped kernel input moves the logits well beyond the tolerance.
    with torch.no_grad():
        for block in lm.model.layers:
            block.attn.w_proj.linear.lora[2].bias.uniform_(-4.0, 0.0)
            block.attn.bonus.normal_(0.0, 0.5)
            for proj in (block.attn.r_proj, block.attn.k_proj, block.attn.v_proj):
                proj.linear.weight.mul_(8.0)
    return lm


def noise_state(model: RWKV6LM, batch: int, seed: int = 1) -> RWKV6State:
    g = torch.Generator().manual_seed(seed)
    zero = model.zero_state(batch)
    return RWKV6State(*(torch.randn(t.shape, generator=g) * 0.3 for t in zero.parts().values()))


def forward_backward(model: RWKV6LM, ids: torch.Tensor, init: RWKV6State, backend: str):
    """Logits, final state and the gradient of every parameter and of every part of the initial state."""
    model.zero_grad(set_to_none=True)
    init = RWKV6State(*(t.clone().requires_grad_() for t in init.parts().values()))
    logits, final = model(ids, init, backend=backend)
    # The final state enters the loss too, so the kernel's backward from the final state (dht) is checked.
    loss = token_loss(logits[:, :-1], ids[:, 1:], None) + final.wkv.pow(2).mean()
    loss.backward()
    grads = {name: None if p.grad is None else p.grad.clone() for name, p in model.named_parameters()}
    for name, t in init.parts().items():
        grads[f"initial_state.{name}"] = t.grad
    return logits.detach(), final.detach(), grads


def test_logits_state_and_every_gradient_match(model, close_scaled):
    ids = torch.randint(0, 257, (2, LENGTH), generator=torch.Generator().manual_seed(2))
    init = noise_state(model, 2)
    ref_logits, ref_final, ref_grads = forward_backward(model, ids, init, "torch")
    logits, final, grads = forward_backward(model, ids, init, "kernel")
    close_scaled(logits, ref_logits, 1e-5, "logits")
    assert final.wkv.dtype == torch.float32
    close_scaled(final.wkv, ref_final.wkv, 1e-5, "final wkv state")
    close_scaled(final.att_shift, ref_final.att_shift, 1e-6, "final time-mix shift")
    missing = sorted(name for name, g in grads.items() if g is None)
    assert not missing, f"no gradient for {missing}"
    assert float(grads["initial_state.wkv"].abs().max()) > 0
    for name, ref in ref_grads.items():
        close_scaled(grads[name], ref, 1e-4, f"gradient of {name}")


def test_split_with_carried_state_equals_one_call(model, split_equals_one_call):
    ids = torch.randint(0, 257, (2, LENGTH), generator=torch.Generator().manual_seed(3))
    # a cut inside the first chunk, a one-token call, and a remainder across fla's chunk boundary
    split_equals_one_call(model, ids, noise_state(model, 2, seed=4), cuts=(20, 21),
                          part_tols={"wkv": 1e-5, "att_shift": 1e-6, "ffn_shift": 1e-6}, recurrent="wkv")
