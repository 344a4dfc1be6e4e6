"""RWKV-7 backend="kernel" == backend="torch", and recurlen's LM == fla's own RWKV7ForCausalLM on the same weights in
fla's format, with flash-linear-attention's real Triton kernels executed on CPU under Triton's interpreter (make
test-kernels).

The kernel backend is recurlen's own glue (recurlen/models/rwkv7/kernels.py and the time mix's kernel branch)
calling fla's `chunk_rwkv7` as fla's layer does (safe_gate, RWKV-7's decay floor, chunks of 64). fla's model
(flash-linear-attention, installed --no-deps beside fla-core) reads the checkpoint recurlen writes in fla's format;
its cache holds the WKV state key-major and both token shifts. Its from-scratch init is compared with recurlen's.

Shapes are tiny (the interpreter runs every kernel program in numpy): hidden 64, 4 heads of 16, 2 layers, a length
that is not a multiple of fla's chunk (64) and cuts inside a chunk.
"""

import warnings

import pytest
import torch

from recurlen.models.rwkv7 import RWKV7LM, RWKV7Config, RWKV7State
from recurlen.training.lit_module import token_loss

pytestmark = [pytest.mark.kernels]

LENGTH = 70  # one full chunk of 64 and a partial one
# fla's chunk_rwkv7 is ~2e-5 from the float64 recurrence where recurlen's scan is ~2e-7
# (test_the_kernel_op_against_the_float64_recurrence); through the sharpened 2-layer model below that measured
# 8e-5 (logits), 1.1e-4 (wkv) and 1.9e-4 (the worst gradient) between the backends.
KERNEL_TOL = 5e-4
GRAD_TOL = 1e-3
NANO = dict(hidden_size=64, num_hidden_layers=2, head_dim=16, decay_low_rank_dim=8, gate_low_rank_dim=16,
            a_low_rank_dim=8, v_low_rank_dim=8, intermediate_size=128, chunk_size=16)


@pytest.fixture(scope="module", autouse=True)
def rwkv7_interpreter(triton_cpu):
    """fla's chunk_rwkv7 imported afresh under the interpreter (the loader's cache cleared around it)."""
    from recurlen.models.rwkv7 import kernels

    kernels._chunk_rwkv7.cache_clear()
    found, why = kernels._chunk_rwkv7()
    if found is None:
        pytest.fail(f"fla's chunk_rwkv7 does not import ({why}); make test-kernels installs fla-core")
    yield
    kernels._chunk_rwkv7.cache_clear()


def make_model(seed: int = 0, **fields) -> RWKV7LM:
    """fla's init with every zero-initialised matrix (o_proj, the channel mix's value, the LoRAs' first halves) given
    random values, so that a swapped or dropped kernel input moves the logits well beyond the tolerance."""
    torch.manual_seed(seed)
    model = RWKV7LM(RWKV7Config(**{**NANO, **fields}), backend="torch").eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2 and float(p.abs().max()) == 0:
                p.normal_(0.0, 0.3)
        for block in model.model.layers:
            block.attn.k_proj.weight.mul_(10.0)  # fla's gain 0.1
    return model


def noise_state(model: RWKV7LM, batch: int, seed: int = 1) -> RWKV7State:
    g = torch.Generator().manual_seed(seed)
    return RWKV7State(*(torch.randn(t.shape, generator=g) * 0.3 for t in model.zero_state(batch).parts().values()))


def forward_backward(model: RWKV7LM, ids: torch.Tensor, init: RWKV7State, backend: str):
    """Logits, final state and the gradient of every parameter and of every part of the initial state."""
    model.zero_grad(set_to_none=True)
    init = RWKV7State(*(t.clone().requires_grad_() for t in init.parts().values()))
    logits, final = model(ids, init, backend=backend)
    # The final state enters the loss too, so the kernel's backward from the final state (dht) is checked.
    loss = token_loss(logits[:, :-1], ids[:, 1:], None) + final.wkv.pow(2).mean()
    loss.backward()
    grads = {name: None if p.grad is None else p.grad.clone() for name, p in model.named_parameters()}
    for name, t in init.parts().items():
        grads[f"initial_state.{name}"] = t.grad
    return logits.detach(), final.detach(), grads


def scaled_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.double() - ref.double()).abs().max() / ref.double().abs().max().clamp_min(1e-6))


def test_logits_state_and_every_gradient_match(close_scaled):
    model = make_model()
    ids = torch.randint(0, 257, (2, LENGTH), generator=torch.Generator().manual_seed(2))
    init = noise_state(model, 2)
    ref_logits, ref_final, ref_grads = forward_backward(model, ids, init, "torch")
    logits, final, grads = forward_backward(model, ids, init, "kernel")
    missing = sorted(name for name, g in grads.items() if g is None)
    assert not missing, f"no gradient for {missing}"
    errors = {name: scaled_error(grads[name], ref) for name, ref in ref_grads.items()}
    worst = max(errors, key=errors.get)
    print(f"\nkernel vs torch (error / max |torch|): logits {scaled_error(logits, ref_logits):.1e}, wkv "
          f"{scaled_error(final.wkv, ref_final.wkv):.1e}, gradients up to {errors[worst]:.1e} ({worst}), the "
          f"initial state's {errors['initial_state.wkv']:.1e}")
    close_scaled(logits, ref_logits, KERNEL_TOL, "logits")
    assert final.wkv.dtype == torch.float32
    close_scaled(final.wkv, ref_final.wkv, KERNEL_TOL, "final wkv state")
    # the second layer's shift holds its input, which carries the first layer's kernel-vs-torch rounding
    close_scaled(final.att_shift, ref_final.att_shift, KERNEL_TOL, "final time-mix shift")
    assert float(grads["initial_state.wkv"].abs().max()) > 0
    for name, ref in ref_grads.items():
        close_scaled(grads[name], ref, GRAD_TOL, f"gradient of {name}")


def test_the_kernel_op_against_the_float64_recurrence():
    """fla's chunk_rwkv7 alone, on RWKV-7's ranges (tests/models/rwkv7/test_rwkv7_scan.py's inputs): it is the less
    exact of the two paths (its WY inverse is built in float32 with factors up to e^20), which is why the LM-level
    tolerances above are KERNEL_TOL and not the torch path's 1e-5."""
    from test_rwkv7_scan import _inputs, recurrence  # this folder is on the path (pytest prepends it)

    from recurlen.models.rwkv7 import kernels
    from recurlen.models.rwkv7.scan import wkv7_chunked

    *x, h0 = _inputs(batch=2, length=LENGTH, heads=2, dk=16, dv=16, seed=3)
    o64, S64 = recurrence(*x, h0)
    o, S = kernels.chunk_rwkv7(*(t.float() for t in x), initial_state_BHKV=h0.float())
    o_t, S_t = wkv7_chunked(*(t.float() for t in x), chunk_size=16, initial_state_BHKV=h0.float())
    print(f"\nvs float64 recurrence (error / max): fla's chunk_rwkv7 o {scaled_error(o, o64):.1e}, state "
          f"{scaled_error(S, S64):.1e}; recurlen's scan o {scaled_error(o_t, o64):.1e}, state "
          f"{scaled_error(S_t, S64):.1e}")
    assert scaled_error(o, o64) < 5e-5 and scaled_error(S, S64) < 5e-5
    assert scaled_error(o_t, o64) < 1e-6 and scaled_error(S_t, S64) < 1e-6


def test_split_with_carried_state_equals_one_call(split_equals_one_call):
    model = make_model(seed=3)
    ids = torch.randint(0, 257, (2, LENGTH), generator=torch.Generator().manual_seed(3))
    # a cut inside the first chunk, a one-token call, and a remainder across fla's chunk boundary
    split_equals_one_call(model, ids, noise_state(model, 2, seed=4), cuts=(20, 21), logits_tol=KERNEL_TOL,
                          part_tols={"wkv": KERNEL_TOL, "att_shift": KERNEL_TOL, "ffn_shift": KERNEL_TOL},
                          recurrent="wkv")


def _fla_model_cls():
    pytest.importorskip("fla.models", reason="flash-linear-attention is not installed (make test-kernels installs it)")
    from fla.models import RWKV7ForCausalLM

    return RWKV7ForCausalLM


def _fla_state(cache, layers: int) -> RWKV7State:
    """fla's cache per layer: recurrent_state (B, H, K, V) key-major, conv_state (the time mix's last input, B, D),
    ffn_state (the channel mix's)."""
    return RWKV7State(*(torch.stack([cache[i][key].float() for i in range(layers)])
                        for key in ("recurrent_state", "conv_state", "ffn_state")))


def test_fla_s_own_model_on_the_same_checkpoint(tmp_path, close_scaled):
    """fla's RWKV7ForCausalLM loads recurlen's fla-format export: the same logits and state in one pass (its chunk
    kernel, which it takes under grad) and in two with its cache carried (without grad and under 64 tokens it takes
    its fused recurrent kernel). One lane: the interpreter's time grows with the lanes."""
    fla_cls = _fla_model_cls()
    model = make_model(seed=5)
    model.save_pretrained(str(tmp_path / "ckpt"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fla warns that its RWKV-7 may differ from BlinkDL's
        fla_model = fla_cls.from_pretrained(str(tmp_path / "ckpt"), dtype=torch.float32).eval()
    ids = torch.randint(0, 257, (1, LENGTH), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        ref_logits, ref_state = model(ids)
    with torch.enable_grad():
        out = fla_model(input_ids=ids, use_cache=True)
    with torch.no_grad():
        first = fla_model(input_ids=ids[:, :45], use_cache=True)
        second = fla_model(input_ids=ids[:, 45:], past_key_values=first.past_key_values, use_cache=True)
    split_logits = torch.cat([first.logits, second.logits], dim=1).detach()
    layers = model.config.num_hidden_layers
    for what, logits, cache in (("one pass", out.logits.detach(), out.past_key_values),
                                ("split with the cache", split_logits, second.past_key_values)):
        state = _fla_state(cache, layers)
        print(f"\nfla's RWKV7ForCausalLM vs recurlen ({what}; error / max): logits "
              f"{scaled_error(logits, ref_logits):.1e}, wkv {scaled_error(state.wkv, ref_state.wkv):.1e}, shifts "
              f"{scaled_error(state.att_shift, ref_state.att_shift):.1e} / "
              f"{scaled_error(state.ffn_shift, ref_state.ffn_shift):.1e}")
        close_scaled(logits, ref_logits, KERNEL_TOL, f"logits, fla {what}")
        for name in ("wkv", "att_shift", "ffn_shift"):
            close_scaled(getattr(state, name), getattr(ref_state, name), KERNEL_TOL, f"{name}, fla {what}")


def test_from_scratch_init_equals_fla_s(tmp_path):
    """Every parameter fla's RWKV7ForCausalLM sets deterministically is equal; the random ones (orthogonal, uniform)
    have fla's distribution: the same gain (W^T W or W W^T = gain^2 I) and range."""
    from fla.models import RWKV7Config as FlaRWKV7Config

    fla_cls = _fla_model_cls()
    cfg = RWKV7Config(**{**NANO, "num_hidden_layers": 3})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fla_model = fla_cls(FlaRWKV7Config(**cfg.to_official_json()))
    ours = dict(RWKV7LM(cfg).named_parameters())
    theirs = dict(fla_model.named_parameters())
    assert ours.keys() == theirs.keys()
    random = {"weight": ("r_proj", "k_proj", "v_proj", "lora.2", "ffn.key", "lm_head")}
    for name, want in theirs.items():
        got, want = ours[name].detach().double(), want.detach().double()
        assert got.shape == want.shape, name
        if name.endswith("embeddings.weight"):
            assert float(got.abs().max()) <= 1e-4 and float(want.abs().max()) <= 1e-4
        elif any(part in name for part in random["weight"]) and name.endswith("weight"):
            gram = (lambda w: w.T @ w if w.shape[0] >= w.shape[1] else w @ w.T)
            torch.testing.assert_close(gram(got), gram(want), atol=1e-5, rtol=0, msg=f"{name}: gain")
        else:
            torch.testing.assert_close(got, want, atol=1e-6, rtol=0, msg=name)


def test_packed_rows_take_fla_s_varlen_path(close_scaled):
    """Documents packed in rows (`resets`): the kernel path (fla's cu_seqlens) equals the torch path, which
    tests/models/test_packed_resets.py checks against the documents run one by one; without the flags the logits
    differ, so the comparison has power."""
    model = make_model(seed=7)
    ids = torch.randint(0, 257, (2, 48), generator=torch.Generator().manual_seed(8))  # within one chunk: ~35 s
    resets = torch.zeros(2, 48, dtype=torch.bool)
    resets[0, [16, 17, 40]] = True  # a one-token document, starts on and off the torch scan's chunks of 16
    resets[1, 0] = True  # the state handed in dropped
    init = noise_state(model, 2, seed=9)
    with torch.no_grad():
        ref_logits, ref_final = model(ids, init, resets=resets, backend="torch")
        logits, final = model(ids, init, resets=resets, backend="kernel")
        joined, _ = model(ids, init, backend="kernel")
    print(f"\npacked rows, kernel vs torch: logits {scaled_error(logits, ref_logits):.1e}, wkv "
          f"{scaled_error(final.wkv, ref_final.wkv):.1e}")
    close_scaled(logits, ref_logits, KERNEL_TOL, "logits, packed rows")
    for name, ref in ref_final.parts().items():
        close_scaled(getattr(final, name), ref, KERNEL_TOL, f"final {name}, packed rows")
    assert scaled_error(joined[0, 16:], ref_logits[0, 16:]) > 1e-2
