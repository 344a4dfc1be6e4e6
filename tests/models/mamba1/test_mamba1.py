"""Mamba-1: the chunked scan against an independent float64 recurrence, its state layout, transformers'
MambaForCausalLM on the same weights, and official-format checkpoints (the contract every architecture shares is
tests/models/test_architectures.py)."""

import json

import pytest
import torch
import torch.nn.functional as F

from recurlen.models.mamba1 import Mamba1Config, Mamba1LM, preset
from recurlen.models.mamba1.kernels import fold_initial_state, selective_scan
from recurlen.models.mamba1.scan import selective_scan_chunked

F64 = torch.float64


def recurrence(x, dt, A, B, C, h0):
    """Mamba-1's recurrence token by token, written from the paper's equations (float64 reference)."""
    h, ys = h0, []
    for t in range(x.shape[1]):
        decay = torch.exp(dt[:, t, :, None] * A)  # (B, D, N)
        h = decay * h + dt[:, t, :, None] * x[:, t, :, None] * B[:, t, None, :]
        ys.append(torch.einsum("bdn,bn->bd", h, C[:, t]))
    return torch.stack(ys, dim=1), h


def _inputs(batch=2, length=37, d_inner=6, d_state=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    kw = dict(dtype=F64, generator=g)
    x = torch.randn(batch, length, d_inner, **kw)
    dt = torch.rand(batch, length, d_inner, **kw) * 0.5 + 0.01
    A = -torch.rand(d_inner, d_state, **kw) * 3 - 0.05
    B = torch.randn(batch, length, d_state, **kw)
    C = torch.randn(batch, length, d_state, **kw)
    h0 = torch.randn(batch, d_inner, d_state, **kw)
    return [x, dt, A, B, C, h0]


def _loss_grads(fn, inputs, seed=4):
    g = torch.Generator().manual_seed(seed)
    y, h = fn(*inputs)
    w_y = torch.randn(y.shape, dtype=F64, generator=g)
    w_h = torch.randn(h.shape, dtype=F64, generator=g)
    return y, h, torch.autograd.grad((y * w_y).sum() + (h * w_h).sum(), inputs)


@pytest.mark.parametrize("chunk_size", [1, 4, 7, 64])
@pytest.mark.parametrize("length", [1, 13, 37])
def test_chunked_scan_equals_recurrence_outputs_states_and_all_gradients(chunk_size, length):
    inputs = [t.requires_grad_() for t in _inputs(length=length)]
    y_ref, h_ref, g_ref = _loss_grads(recurrence, inputs)
    y, h, g = _loss_grads(lambda x, dt, A, B, C, h0: selective_scan_chunked(
        x, dt, A, B, C, chunk_size=chunk_size, initial_state_BDN=h0), inputs)
    assert y.dtype == F64 and h.dtype == F64
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(h, h_ref, rtol=1e-10, atol=1e-10)
    for name, got, want in zip(("x", "dt", "A", "B", "C", "h0"), g, g_ref):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9, msg=f"gradient of {name}")


def test_float32_scan_is_close_to_float64_and_stable_for_strong_decays():
    x, dt, A, B, C, h0 = _inputs(length=300)
    dt = dt * 40  # decays down to exp(-600) per step: no overflow, no NaN
    y64, h64 = recurrence(x, dt, A, B, C, h0)
    y32, h32 = selective_scan_chunked(*(t.float() for t in (x, dt, A, B, C)), chunk_size=32,
                                      initial_state_BDN=h0.float())
    assert torch.isfinite(y32).all() and y32.dtype == torch.float32
    torch.testing.assert_close(y32.double(), y64, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(h32.double(), h64, rtol=1e-4, atol=1e-4)


def test_folded_initial_state_equals_scan_from_that_state_with_gradients():
    # The GPU path: a scan from zero plus the initial state's share must equal the scan from h0.
    inputs = [t.requires_grad_() for t in _inputs(length=29)]
    x, dt, A, B, C, h0 = inputs

    def folded(x, dt, A, B, C, h0):
        y_zero, h_zero = recurrence(x, dt, A, B, C, torch.zeros_like(h0))
        y0, h_part = fold_initial_state(dt, A, C, h0, chunk=8)
        return y_zero + y0, h_zero + h_part

    y_ref, h_ref, g_ref = _loss_grads(recurrence, inputs)
    y, h, g = _loss_grads(folded, inputs)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(h, h_ref, rtol=1e-10, atol=1e-10)
    for name, got, want in zip(("x", "dt", "A", "B", "C", "h0"), g, g_ref):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9, msg=f"gradient of {name}")


def reference_selective_scan_fn(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                                return_last_state=False):
    """mamba-ssm's documented selective_scan_fn contract: (batch, dim, L) layout, h starts at zero."""
    delta = delta + delta_bias[:, None] if delta_bias is not None else delta
    delta = F.softplus(delta) if delta_softplus else delta
    y, last = recurrence(u.transpose(1, 2), delta.transpose(1, 2), A, B.transpose(1, 2), C.transpose(1, 2),
                         u.new_zeros(u.shape[0], u.shape[1], A.shape[1]))
    y = y.transpose(1, 2) + (u * D[:, None] if D is not None else 0)
    return (y, last) if return_last_state else y


def test_kernel_glue_with_documented_scan_contract_matches_the_torch_path():
    x, dt_raw, A, B, C, h0 = _inputs(length=21)
    D = torch.rand(x.shape[-1], dtype=F64)
    bias = torch.randn(x.shape[-1], dtype=F64) * 0.3
    y, h = selective_scan(x, dt_raw, A, B, C, D_I=D, dt_bias_I=bias, initial_state_BIN=h0,
                          scan_fn=reference_selective_scan_fn)
    y_ref, h_ref = recurrence(x, F.softplus(dt_raw + bias), A, B, C, h0)
    torch.testing.assert_close(y.double(), y_ref + x * D, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h.double(), h_ref, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------- the LM
def test_state_layout(nano_model):
    state = nano_model("mamba1").zero_state(4)
    assert state.ssm.shape == (2, 4, 128, 8) and state.conv.shape == (2, 4, 128, 3)
    assert state.group_view("ssm").shape == (2, 1, 4 * 128 * 8)  # fitted noise per layer


def test_matches_transformers_mamba_logits_and_cache_states(nano_model):
    transformers = pytest.importorskip("transformers")
    model = nano_model("mamba1")
    cfg = model.config
    peer = transformers.MambaForCausalLM(transformers.MambaConfig(
        vocab_size=cfg.padded_vocab_size, hidden_size=cfg.d_model, state_size=cfg.d_state,
        num_hidden_layers=cfg.n_layer, layer_norm_epsilon=cfg.norm_eps, expand=cfg.expand, conv_kernel=cfg.d_conv,
        use_bias=cfg.bias, use_conv_bias=cfg.conv_bias, time_step_rank=cfg.dt_rank,
        residual_in_fp32=cfg.residual_in_fp32, tie_word_embeddings=True)).eval()
    # Same names but the embedding: the official `embedding`, transformers' `embeddings`.
    weights = {k.replace("backbone.embedding.", "backbone.embeddings."): v for k, v in model.state_dict().items()}
    missing, unexpected = peer.load_state_dict(weights, strict=False)
    assert not missing and not unexpected
    ids = torch.randint(0, 257, (2, 45))
    with torch.no_grad():
        out = peer(ids, use_cache=True)
        logits, state = model(ids)
    torch.testing.assert_close(logits, out.logits[..., :257], rtol=1e-4, atol=1e-4)
    cache = out.cache
    for i in range(cfg.n_layer):
        torch.testing.assert_close(state.ssm[i], cache.get_recurrent_state(i, state_idx=0).float(),
                                   rtol=1e-5, atol=1e-6)
        # transformers keeps the last d_conv inputs; the state needs the last d_conv - 1.
        torch.testing.assert_close(state.conv[i], cache.get_conv_state(i, state_idx=0)[..., 1:].float(),
                                   rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------- checkpoints
OFFICIAL_CONFIG = {"d_model": 64, "n_layer": 2, "vocab_size": 300, "ssm_cfg": {}, "rms_norm": True,
                   "residual_in_fp32": True, "fused_add_norm": True, "pad_vocab_size_multiple": 8}


def _write_official(directory, *, config=None, edit=None):
    """What a state-spaces/mamba-* repository holds: config.json and fp16 weights with both tied keys."""
    directory.mkdir(parents=True, exist_ok=True)
    cfg = config or OFFICIAL_CONFIG
    (directory / "config.json").write_text(json.dumps(cfg))
    torch.manual_seed(0)
    model = Mamba1LM(Mamba1Config.from_official_json(cfg))
    sd = {k: v.half().clone() for k, v in model.state_dict().items()}
    if edit:
        edit(sd)
    torch.save(sd, directory / "pytorch_model.bin")
    return sd


def test_official_directory_loads_strictly(tmp_path):
    sd = _write_official(tmp_path / "ckpt")
    model = Mamba1LM.from_pretrained(str(tmp_path / "ckpt"), backend="torch")
    cfg = model.config
    assert (cfg.d_model, cfg.n_layer, cfg.dt_rank, cfg.d_state, cfg.padded_vocab_size) == (64, 2, 4, 16, 304)
    assert torch.equal(model.backbone.layers[1].mixer.A_log, sd["backbone.layers.1.mixer.A_log"].float())
    assert model.lm_head.weight is model.backbone.embedding.weight
    logits, state = model(torch.randint(0, 300, (1, 9)))
    assert logits.shape == (1, 9, 300) and state.ssm.shape == (2, 1, 128, 16)


@pytest.mark.parametrize("edit,match", [
    (lambda sd: sd.pop("backbone.layers.1.mixer.x_proj.weight"),
     r"missing \['backbone.layers.1.mixer.x_proj.weight'\]"),
    (lambda sd: sd.__setitem__("backbone.layers.0.mixer.extra", torch.zeros(1)),
     r"unexpected \['backbone.layers.0.mixer.extra'\]"),
    (lambda sd: sd.__setitem__("backbone.layers.0.mixer.A_log", torch.zeros(128, 8)),
     r"backbone.layers.0.mixer.A_log has shape \(128, 8\), the config needs \(128, 16\)"),
])
def test_bad_checkpoints_name_the_problem(tmp_path, edit, match):
    _write_official(tmp_path / "bad", edit=edit)
    with pytest.raises(ValueError, match=match):
        Mamba1LM.from_pretrained(str(tmp_path / "bad"))


def test_mamba2_config_is_refused_with_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"ssm_cfg.layer is 'Mamba2'"):
        Mamba1Config.from_official_json({**OFFICIAL_CONFIG, "ssm_cfg": {"layer": "Mamba2"}})
    with pytest.raises(ValueError, match=r"unknown ssm_cfg keys \['headdim'\]"):
        Mamba1Config.from_official_json({**OFFICIAL_CONFIG, "ssm_cfg": {"headdim": 64}})


def test_saved_config_and_official_shapes(tmp_path, nano_model):
    nano_model("mamba1").save_pretrained(str(tmp_path / "out"))
    assert "layer" not in json.loads((tmp_path / "out" / "config.json").read_text())["ssm_cfg"]
    big = Mamba1LM(preset("130m"), backend="torch")
    shapes = {k: tuple(v.shape) for k, v in big.state_dict().items()}
    assert shapes["backbone.embedding.weight"] == (50280, 768)
    assert shapes["backbone.layers.0.mixer.in_proj.weight"] == (3072, 768)
    assert shapes["backbone.layers.0.mixer.x_proj.weight"] == (48 + 32, 1536)
    assert shapes["backbone.layers.0.mixer.dt_proj.weight"] == (1536, 48)
    assert shapes["backbone.layers.0.mixer.A_log"] == (1536, 16)
    assert 125e6 < big.num_parameters() < 135e6  # mamba-130m: 129M with the tied head counted once


def test_A_initialisation_is_s4d_real_by_default_or_sampled_in_the_given_range():
    torch.manual_seed(0)
    s4d = Mamba1LM(preset("nano"))
    A = s4d.backbone.layers[0].mixer.A_log.exp()
    assert torch.allclose(A, torch.arange(1, A.shape[1] + 1, dtype=A.dtype).repeat(A.shape[0], 1))
    slow = Mamba1LM(preset("nano", A_init_range=[0.001, 0.1], A_init_log_uniform=True))
    A = slow.backbone.layers[0].mixer.A_log.exp()
    assert A.min() >= 0.001 and A.max() <= 0.1 + 1e-7
    assert (A.log10() < -2).float().mean().item() == pytest.approx(0.5, abs=0.1)  # log-uniform: half below 0.01
    assert len(set(A.flatten().tolist())) > A.numel() // 2  # sampled per (channel, state), not per state
    # The range is an initialisation choice, not part of the official config.json.
    assert "A_init_range" not in json.dumps(preset("nano", A_init_range=[0.5, 2.0]).to_official_json())
    with pytest.raises(ValueError, match=r"A_init_range must be null \(S4D-real\) or \[low, high\]"):
        preset("nano", A_init_range=[0.1, 0.01])
