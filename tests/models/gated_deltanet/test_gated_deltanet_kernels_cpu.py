"""Gated DeltaNet backend="kernel" == backend="torch", and recurlen's LM == fla's own GatedDeltaNetForCausalLM, with
flash-linear-attention's real Triton kernels executed on CPU under Triton's interpreter (make test-kernels).

The kernel backend is recurlen's own glue (recurlen/models/gated_deltanet/kernels.py and the layer's kernel branch)
calling fla's `chunk_gated_delta_rule` with what fla's layer fuses into it (q / k L2 norm, beta's sigmoid, the
decay's softplus, grouped value heads). fla's model (flash-linear-attention, installed --no-deps beside fla-core)
reads the checkpoint recurlen writes in fla's format; its cache exposes the state, value-major, and the conv
windows of all conv_size inputs.

Shapes are tiny (the interpreter runs every kernel program in numpy): hidden 64, 2 heads of key dim 16, value
dim 32, lengths that are not a multiple of fla's chunk (64) and cuts inside a chunk.
"""

import pytest
import torch

from recurlen.models.gated_deltanet import GatedDeltaNetConfig, GatedDeltaNetLM, GatedDeltaNetState
from recurlen.training.lit_module import token_loss

pytestmark = [pytest.mark.kernels]

LENGTH = 77  # one full chunk of 64 and a partial one
NANO = dict(hidden_size=64, num_hidden_layers=2, num_heads=2, head_dim=16, intermediate_size=128, chunk_size=16)


@pytest.fixture(scope="module", autouse=True)
def gated_delta_interpreter(triton_cpu):
    """fla's chunk_gated_delta_rule imported afresh under the interpreter (the loader's cache cleared around it)."""
    from recurlen.models.gated_deltanet import kernels

    kernels._chunk_gated_delta_rule.cache_clear()
    found, why = kernels._chunk_gated_delta_rule()
    if found is None:
        pytest.fail(f"fla's chunk_gated_delta_rule does not import ({why}); make test-kernels installs fla-core")
    yield
    kernels._chunk_gated_delta_rule.cache_clear()


def make_model(seed: int = 0, **fields) -> GatedDeltaNetLM:
    """Slow decays, so the initial state still matters at the end, and projections larger than the init (std 0.02),
    so that a swapped or dropped kernel input moves the logits well beyond the tolerance."""
    torch.manual_seed(seed)
    model = GatedDeltaNetLM(GatedDeltaNetConfig(**{**NANO, **fields}), backend="torch").eval()
    with torch.no_grad():
        for block in model.model.layers:
            block.attn.A_log.uniform_(-4.0, -2.0)
            for name in ("q_proj", "k_proj", "v_proj", "o_proj", "b_proj", "g_proj"):
                getattr(block.attn, name).weight.mul_(8.0)
    return model


def noise_state(model: GatedDeltaNetLM, batch: int, seed: int = 1) -> GatedDeltaNetState:
    g = torch.Generator().manual_seed(seed)
    zero = model.zero_state(batch)
    return GatedDeltaNetState(torch.randn(zero.kv.shape, generator=g) * 0.3,
                              torch.randn(zero.conv.shape, generator=g) * 0.5)


def forward_backward(model: GatedDeltaNetLM, ids: torch.Tensor, init: GatedDeltaNetState, backend: str):
    """Logits, final state and the gradient of every parameter and of the initial state."""
    model.zero_grad(set_to_none=True)
    init = GatedDeltaNetState(init.kv.clone().requires_grad_(), init.conv.clone().requires_grad_())
    logits, final = model(ids, init, backend=backend)
    # The final state enters the loss too, so the kernel's backward from the final state (dht) is checked.
    loss = token_loss(logits[:, :-1], ids[:, 1:], None) + final.kv.pow(2).mean() + final.conv.pow(2).mean()
    loss.backward()
    grads = {name: p.grad.clone() if p.grad is not None else None for name, p in model.named_parameters()}
    grads["initial_state.kv"] = init.kv.grad
    grads["initial_state.conv"] = init.conv.grad
    return logits.detach(), final.detach(), grads


@pytest.mark.parametrize("fields", [{}, dict(num_v_heads=4, allow_neg_eigval=True), dict(clamp_min=-0.002)],
                         ids=["default", "grouped", "clamped"])
def test_logits_state_and_every_gradient_match(close_scaled, fields):
    model = make_model(**fields)
    ids = torch.randint(0, 257, (2, LENGTH), generator=torch.Generator().manual_seed(2))
    init = noise_state(model, 2)
    ref_logits, ref_final, ref_grads = forward_backward(model, ids, init, "torch")
    logits, final, grads = forward_backward(model, ids, init, "kernel")
    errors = {"logits": (logits - ref_logits).abs().max(), "kv": (final.kv - ref_final.kv).abs().max()}
    errors.update({f"d {n}": (g - ref_grads[n]).abs().max() for n, g in grads.items() if g is not None})
    worst = max(errors, key=lambda n: float(errors[n]))
    print(f"kernel vs torch ({fields or 'default'}): logits {float(errors['logits']):.2e}, kv "
          f"{float(errors['kv']):.2e}, worst gradient {worst} {float(errors[worst]):.2e}")
    close_scaled(logits, ref_logits, 1e-5, "logits")
    assert final.kv.dtype == torch.float32
    close_scaled(final.kv, ref_final.kv, 1e-5, "final kv state")
    # the second layer's windows hold its inputs, which carry the first layer's kernel-vs-torch rounding
    close_scaled(final.conv, ref_final.conv, 1e-5, "final conv state")
    missing = sorted(name for name, g in grads.items() if g is None)
    assert not missing, f"no gradient for {missing}"
    assert float(grads["initial_state.kv"].abs().max()) > 0
    for name, ref in ref_grads.items():
        close_scaled(grads[name], ref, 1e-4, f"gradient of {name}")


def test_split_with_carried_state_equals_one_call(split_equals_one_call):
    model = make_model(num_v_heads=4)
    ids = torch.randint(0, 257, (2, LENGTH), generator=torch.Generator().manual_seed(3))
    split_equals_one_call(model, ids, noise_state(model, 2, seed=4), cuts=(20, 21),
                          part_tols={"kv": 1e-5, "conv": 1e-6}, recurrent="kv")


def _fla_state(cache, layers: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(kv, conv) from fla's cache: its recurrent state is value-major (B, Hv, V, K), its conv windows hold all
    conv_size inputs (recurlen's hold the last conv_size - 1, all that the next output reads)."""
    kv = torch.stack([cache[i]["recurrent_state"].transpose(-1, -2) for i in range(layers)])
    conv = torch.stack([torch.cat([w[..., 1:] for w in cache[i]["conv_state"]], dim=1) for i in range(layers)])
    return kv.float(), conv.float()


@pytest.mark.parametrize("fields", [{}, dict(num_v_heads=4, allow_neg_eigval=True)], ids=["default", "grouped"])
def test_fla_s_own_model_on_the_same_checkpoint(tmp_path, close_scaled, fields):
    """fla's GatedDeltaNetForCausalLM loads recurlen's fla-format export: the same logits and state in one pass (its
    chunk kernel) and in two with its cache carried (the second call of 27 tokens takes its fused recurrent kernel)."""
    pytest.importorskip("fla.models", reason="flash-linear-attention is not installed (make test-kernels installs it)")
    from fla.models import GatedDeltaNetForCausalLM

    model = make_model(seed=5, **fields)
    model.save_pretrained(str(tmp_path / "ckpt"))
    fla_model = GatedDeltaNetForCausalLM.from_pretrained(str(tmp_path / "ckpt"), dtype=torch.float32).eval()
    ids = torch.randint(0, 257, (2, LENGTH), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        ref_logits, ref_state = model(ids)
        out = fla_model(input_ids=ids, use_cache=True)
        first = fla_model(input_ids=ids[:, :50], use_cache=True)
        second = fla_model(input_ids=ids[:, 50:], past_key_values=first.past_key_values, use_cache=True)
    layers = model.config.num_hidden_layers
    split_logits = torch.cat([first.logits, second.logits], dim=1)
    for what, logits, cache in (("one pass", out.logits, out.past_key_values),
                                ("split with the cache", split_logits, second.past_key_values)):
        kv, conv = _fla_state(cache, layers)
        print(f"fla's GatedDeltaNetForCausalLM vs recurlen ({fields or 'default'}, {what}): logits "
              f"{float((logits - ref_logits).abs().max()):.2e} (of {float(ref_logits.abs().max()):.2f}), kv "
              f"{float((kv - ref_state.kv).abs().max()):.2e}, conv {float((conv - ref_state.conv).abs().max()):.2e}")
        close_scaled(logits, ref_logits, 1e-5, f"logits, fla {what}")
        close_scaled(kv, ref_state.kv, 1e-5, f"kv state, fla {what}")
        close_scaled(conv, ref_state.conv, 1e-5, f"conv windows, fla {what}")
