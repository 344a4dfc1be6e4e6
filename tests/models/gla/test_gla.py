"""GLA: the chunked scan against an independent float64 recurrence, the whole LM against a per-token
reference written from fla's layer equations, its state layout, and fla-hub-format checkpoints (the contract every
architecture shares is tests/models/test_architectures.py)."""

import json

import pytest
import torch
import torch.nn.functional as F

from recurlen.models.gla import GLALM, GLAConfig, GLAState, preset
from recurlen.models.gla.kernels import layout_kwargs
from recurlen.models.gla.scan import gla_chunked

F64 = torch.float64


def recurrence(q, k, v, g, h0, scale):
    """S_t = diag(exp g_t) S_t-1 + k_t^T v_t, o_t = scale q_t S_t, token by token (float64 reference)."""
    S, outs = h0, []
    for t in range(q.shape[1]):
        S = torch.exp(g[:, t]).unsqueeze(-1) * S + k[:, t].unsqueeze(-1) * v[:, t].unsqueeze(-2)
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t] * scale, S))
    return torch.stack(outs, dim=1), S


def _inputs(batch=2, length=45, heads=3, dk=4, dv=5, seed=0, gate_scale=0.5):
    gen = torch.Generator().manual_seed(seed)
    kw = dict(dtype=F64, generator=gen)
    q, k = torch.randn(batch, length, heads, dk, **kw), torch.randn(batch, length, heads, dk, **kw)
    v = torch.randn(batch, length, heads, dv, **kw)
    g = F.logsigmoid(torch.randn(batch, length, heads, dk, **kw)) * gate_scale
    h0 = torch.randn(batch, heads, dk, dv, **kw)
    return [q, k, v, g, h0]


def _loss_grads(fn, inputs, seed=4):
    gen = torch.Generator().manual_seed(seed)
    o, S = fn(*inputs)
    w_o = torch.randn(o.shape, dtype=F64, generator=gen)
    w_s = torch.randn(S.shape, dtype=F64, generator=gen)
    return o, S, torch.autograd.grad((o * w_o).sum() + (S * w_s).sum(), inputs)


@pytest.mark.parametrize("chunk_size", [1, 5, 16, 32, 64])
@pytest.mark.parametrize("length", [1, 17, 45, 100])
def test_chunked_gla_equals_recurrence_outputs_states_and_all_gradients(chunk_size, length):
    inputs = [t.requires_grad_() for t in _inputs(length=length)]
    o_ref, S_ref, g_ref = _loss_grads(lambda *a: recurrence(*a, scale=0.5), inputs)
    o, S, g = _loss_grads(lambda q, k, v, gg, h0: gla_chunked(q, k, v, gg, scale=0.5, chunk_size=chunk_size,
                                                              initial_state_BHKV=h0), inputs)
    assert o.dtype == F64
    torch.testing.assert_close(o, o_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(S, S_ref, rtol=1e-10, atol=1e-10)
    for name, got, want in zip(("q", "k", "v", "g", "h0"), g, g_ref):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9, msg=f"gradient of {name}")


def test_strong_decays_stay_finite_and_exact_in_float32():
    # Per-step log gates down to -40: a chunk of 64 decays by e^-2500, which overflows any
    # factorisation of exp(b_t - b_s) into exp(b_t) exp(-b_s) across a whole chunk.
    q, k, v, g, h0 = _inputs(length=130, gate_scale=40.0)
    o64, S64 = recurrence(q, k, v, g, h0, scale=0.5)
    o32, S32 = gla_chunked(*(t.float() for t in (q, k, v, g)), scale=0.5, chunk_size=64,
                           initial_state_BHKV=h0.float())
    assert torch.isfinite(o32).all()
    torch.testing.assert_close(o32.double(), o64, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(S32.double(), S64, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------- the LM
def _sharpened(model: GLALM) -> GLALM:
    """Slow forget gates so that the initial state matters over the whole test input, and projections larger
    than the from-scratch init (std 0.02) so that the token mixer moves the logits visibly."""
    with torch.no_grad():
        for block in model.model.layers:
            block.attn.gk_proj[1].bias.fill_(6.0)
            for name in ("q_proj", "k_proj", "v_proj", "o_proj", "q_conv1d", "k_conv1d", "v_conv1d"):
                if hasattr(block.attn, name):
                    getattr(block.attn, name).weight.mul_(4.0)
    return model


def reference_lm(model: GLALM, ids: torch.Tensor, kv0: torch.Tensor, conv0: torch.Tensor):
    """The whole LM token by token in float64, from fla's equations, reading the parameters by name."""
    cfg = model.config
    p = {k: v.double() for k, v in model.state_dict().items()}
    H, Dk, Dv = cfg.num_heads, cfg.head_k_dim, cfg.head_v_dim

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.norm_eps) * w

    kv = [kv0[i].double().clone() for i in range(cfg.num_hidden_layers)]
    win = [conv0[i].double().clone() for i in range(cfg.num_hidden_layers)]
    logits = []
    for t in range(ids.shape[1]):
        h = p["model.embeddings.weight"][ids[:, t]]
        for i in range(cfg.num_hidden_layers):
            a = f"model.layers.{i}.attn."
            x = rms(h, p[f"model.layers.{i}.attn_norm.weight"])
            q, k, v = x @ p[a + "q_proj.weight"].T, x @ p[a + "k_proj.weight"].T, x @ p[a + "v_proj.weight"].T
            if cfg.use_short_conv:
                qkv = torch.cat([q, k, v], dim=-1)
                full = torch.cat([win[i], qkv.unsqueeze(-1)], dim=-1)  # (B, C, W + 1)
                weight = torch.cat([p[a + n + "_conv1d.weight"][:, 0] for n in "qkv"])  # (C, W + 1)
                q, k, v = F.silu((full * weight).sum(-1)).split([q.shape[-1], k.shape[-1], v.shape[-1]], dim=-1)
                win[i] = full[..., 1:]
            gk = (x @ p[a + "gk_proj.0.weight"].T) @ p[a + "gk_proj.1.weight"].T + p[a + "gk_proj.1.bias"]
            g = F.logsigmoid(gk) / cfg.gate_logit_normalizer
            q, k, g = (z.view(-1, H, Dk) for z in (q, k, g))
            v = v.view(-1, H, Dv)
            kv[i] = torch.exp(g).unsqueeze(-1) * kv[i] + k.unsqueeze(-1) * v.unsqueeze(-2)
            o = torch.einsum("bhk,bhkv->bhv", q * Dk**-0.5, kv[i])
            o = rms(o, p[a + "g_norm_swish_gate.weight"]) * F.silu((x @ p[a + "g_proj.weight"].T).view(-1, H, Dv))
            h = h + o.flatten(-2) @ p[a + "o_proj.weight"].T
            m = f"model.layers.{i}.mlp."
            x = rms(h, p[f"model.layers.{i}.mlp_norm.weight"])
            hidden = F.silu(x @ p[m + "gate_proj.weight"].T) * (x @ p[m + "up_proj.weight"].T)
            h = h + hidden @ p[m + "down_proj.weight"].T
        logits.append(rms(h, p["model.norm.weight"]) @ p["lm_head.weight"].T)
    return torch.stack(logits, dim=1), torch.stack(kv), torch.stack(win)


@pytest.mark.parametrize("short_conv", [False, True])
def test_lm_equals_float64_per_token_reference(nano_model, short_conv):
    model = _sharpened(nano_model("gla", use_short_conv=short_conv, chunk_size=16))
    ids = torch.randint(0, 257, (2, 37))
    gen = torch.Generator().manual_seed(2)
    zero = model.zero_state(2)
    start = GLAState(torch.randn(zero.kv.shape, generator=gen) * 0.3, torch.randn(zero.conv.shape, generator=gen))
    with torch.no_grad():
        logits, state = model(ids, start)
    ref_logits, ref_kv, ref_conv = reference_lm(model, ids, start.kv, start.conv)
    torch.testing.assert_close(logits.double(), ref_logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state.kv.double(), ref_kv, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(state.conv.double(), ref_conv, rtol=1e-5, atol=1e-5)


def test_state_layout(nano_model):
    assert nano_model("gla").zero_state(4).conv.shape == (2, 4, 0, 3)  # no short convs: an empty window
    state = nano_model("gla", use_short_conv=True).zero_state(4)
    assert state.kv.shape == (2, 4, 2, 16, 32) and state.conv.shape == (2, 4, 32 + 32 + 64, 3)
    assert state.group_view("kv").shape == (2, 2, 4 * 16 * 32)  # fitted noise per (layer, head)


def test_kernel_layout_arguments_follow_the_installed_signature():
    def old(q, k, v, g, scale=None, initial_state=None, output_final_state=False, head_first=True):
        pass

    def new(q, k, v, g, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
            state_v_first=False):
        pass

    assert layout_kwargs(old) == {"head_first": False}
    assert layout_kwargs(new) == {"state_v_first": False}


# ---------------------------------------------------------------------------------- checkpoints
OFFICIAL_CONFIG = {
    "model_type": "gla", "architectures": ["GLAForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
    "num_heads": 2, "num_kv_heads": None, "expand_k": 0.5, "expand_v": 1, "hidden_ratio": 4,
    "intermediate_size": None, "attn_mode": "chunk", "use_short_conv": False, "conv_size": 4,
    "use_output_gate": True, "clamp_min": None, "hidden_act": "swish", "max_position_embeddings": 2048,
    "elementwise_affine": True, "norm_eps": 1e-06, "use_gk": True, "use_gv": False, "attn": None,
    "use_cache": True, "pad_token_id": None, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False,
    "initializer_range": 0.02, "fuse_norm": True, "fuse_swiglu": True, "fuse_cross_entropy": True,
    "vocab_size": 300, "transformers_version": "4.45.0", "feature_map": None,
}


def _write_official(directory, *, config=None, edit=None):
    """What an fla-hub/gla-* repository holds: fla's config.json and bf16 safetensors."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    cfg = config or OFFICIAL_CONFIG
    (directory / "config.json").write_text(json.dumps(cfg))
    torch.manual_seed(0)
    model = GLALM(GLAConfig.from_official_json(cfg))
    sd = {k: v.to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    if edit:
        edit(sd)
    save_file(sd, str(directory / "model.safetensors"))
    return sd


def test_official_directory_loads_strictly(tmp_path):
    sd = _write_official(tmp_path / "ckpt")
    model = GLALM.from_pretrained(str(tmp_path / "ckpt"), backend="torch")
    cfg = model.config
    assert (cfg.hidden_size, cfg.num_heads, cfg.head_k_dim, cfg.head_v_dim, cfg.mlp_size) == (64, 2, 16, 32, 256)
    assert torch.equal(model.model.layers[1].attn.gk_proj[1].bias, sd["model.layers.1.attn.gk_proj.1.bias"].float())
    assert model.lm_head.weight is not model.model.embeddings.weight
    logits, state = model(torch.randint(0, 300, (1, 9)))
    assert logits.shape == (1, 9, 300) and state.kv.shape == (2, 1, 2, 16, 32)


@pytest.mark.parametrize("edit,match", [
    (lambda sd: sd.pop("model.layers.1.attn.g_proj.weight"), r"missing \['model.layers.1.attn.g_proj.weight'\]"),
    (lambda sd: sd.__setitem__("model.layers.0.attn.gv_proj.weight", torch.zeros(2, 2)),
     r"unexpected \['model.layers.0.attn.gv_proj.weight'\]"),
    (lambda sd: sd.__setitem__("model.layers.0.attn.q_proj.weight", torch.zeros(16, 64)),
     r"model.layers.0.attn.q_proj.weight has shape \(16, 64\), the config needs \(32, 64\)"),
])
def test_bad_checkpoints_name_the_problem(tmp_path, edit, match):
    _write_official(tmp_path / "bad", edit=edit)
    with pytest.raises(ValueError, match=match):
        GLALM.from_pretrained(str(tmp_path / "bad"))


def test_older_embedding_name_and_short_conv_checkpoint_load(tmp_path):
    cfg = {**OFFICIAL_CONFIG, "use_short_conv": True, "tie_word_embeddings": True}
    sd = _write_official(tmp_path / "old", config=cfg, edit=lambda sd: (
        sd.__setitem__("model.embed_tokens.weight", sd.pop("model.embeddings.weight")), sd.pop("lm_head.weight")))
    model = GLALM.from_pretrained(str(tmp_path / "old"))
    assert torch.equal(model.lm_head.weight, sd["model.embed_tokens.weight"].float())
    assert model.zero_state(1).conv.shape == (2, 1, 32 + 32 + 64, 3)


def test_unsupported_configs_are_refused_clearly():
    with pytest.raises(ValueError, match="model_type is 'mamba'"):
        GLAConfig.from_official_json({**OFFICIAL_CONFIG, "model_type": "mamba"})
    with pytest.raises(ValueError, match=r"attn=\{'layers': \[1\]\} \(hybrid attention layers\) is not supported"):
        GLAConfig.from_official_json({**OFFICIAL_CONFIG, "attn": {"layers": [1]}})
    with pytest.raises(ValueError, match="feature_map='relu' is not supported"):
        GLAConfig.from_official_json({**OFFICIAL_CONFIG, "feature_map": "relu"})
    with pytest.raises(ValueError, match="divisible by num_kv_heads"):
        GLAConfig(num_heads=3, num_kv_heads=2, hidden_size=96)


def test_saved_config_is_fla_s_and_official_shapes(tmp_path, nano_model):
    model = nano_model("gla", use_short_conv=True, num_kv_heads=1)
    model.save_pretrained(str(tmp_path / "out"))
    official = json.loads((tmp_path / "out" / "config.json").read_text())
    assert official["model_type"] == "gla" and GLAConfig.from_official_json(official) == GLAConfig.from_dict(
        {**model.config.to_dict(), "chunk_size": 64})
    big = GLALM(preset("340m"), backend="torch")
    shapes = {k: tuple(v.shape) for k, v in big.state_dict().items()}
    assert shapes["model.layers.0.attn.q_proj.weight"] == (512, 1024)
    assert shapes["model.layers.0.attn.v_proj.weight"] == (1024, 1024)
    assert shapes["model.layers.0.attn.gk_proj.0.weight"] == (16, 1024)
    assert shapes["model.layers.0.attn.g_norm_swish_gate.weight"] == (256,)
    assert shapes["model.layers.0.mlp.gate_proj.weight"] == (2816, 1024)
    assert 335e6 < big.num_parameters() < 345e6


def test_forget_gate_bias_starts_at_zero_or_in_the_given_range():
    torch.manual_seed(0)
    assert all(torch.count_nonzero(b.attn.gk_proj[1].bias) == 0 for b in GLALM(preset("nano")).model.layers)
    slow = GLALM(preset("nano", gate_bias_init_range=[2.0, 6.0]))
    for block in slow.model.layers:
        bias = block.attn.gk_proj[1].bias
        assert bias.min() >= 2.0 and bias.max() <= 6.0 and bias.std() > 0.5
    # Forget gates start closer to 1: sigmoid(bias)^(1/16) >= 0.992 instead of 0.958.
    gate = torch.sigmoid(slow.model.layers[0].attn.gk_proj[1].bias) ** (1 / 16)
    assert gate.min() > 0.99
    # Not an fla field: never written to an official config.json, and an official config does not set it.
    official = preset("nano", gate_bias_init_range=[2.0, 6.0]).to_official_json()
    assert "gate_bias_init_range" not in official
    assert GLAConfig.from_official_json({**official, "gate_bias_init_range": [1, 2]}).gate_bias_init_range is None
    with pytest.raises(ValueError, match=r"gate_bias_init_range must be null or \[low, high\]"):
        preset("nano", gate_bias_init_range=[3.0, 1.0])
