"""The Gated DeltaNet LM: against a float64 per-token reference written from fla's layer equations (reading the
parameters by their fla names), split invariance and step == forward for its variants, fla's initialisation, its
state layout and checkpoints in fla's format (the contract every architecture shares is
tests/models/test_architectures.py)."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from recurlen.models.gated_deltanet import GatedDeltaNetConfig, GatedDeltaNetLM, GatedDeltaNetState

NANO = dict(hidden_size=64, num_hidden_layers=2, num_heads=2, head_dim=16, hidden_ratio=2, intermediate_size=128)
VARIANTS = {
    "default": {},
    "grouped values, negative eigenvalues, sigmoid gate": dict(num_v_heads=4, allow_neg_eigval=True,
                                                               output_gate_activation="sigmoid"),
    "no short convs, no gate": dict(use_short_conv=False, use_gate=False),
    # the demo's model-organism clamp, binding on part of the sharpened decays (g from -0.008 to -1e-4)
    "decay clamped": dict(clamp_min=-0.002),
}


def nano(seed=0, **fields) -> GatedDeltaNetLM:
    torch.manual_seed(seed)
    return GatedDeltaNetLM(GatedDeltaNetConfig(**{**NANO, "chunk_size": 16, **fields}), backend="torch").eval()


def sharpened(model: GatedDeltaNetLM) -> GatedDeltaNetLM:
    """Slow decays so that the initial state matters over the whole input, and projections larger than the init
    (std 0.02) so that the token mixer moves the logits visibly."""
    with torch.no_grad():
        for block in model.model.layers:
            block.attn.A_log.uniform_(-4.0, -2.0)
            for name in ("q_proj", "k_proj", "v_proj", "o_proj", "b_proj", "g_proj"):
                if hasattr(block.attn, name):
                    getattr(block.attn, name).weight.mul_(8.0)
    return model


def random_state(model: GatedDeltaNetLM, batch: int, seed: int = 2) -> GatedDeltaNetState:
    gen = torch.Generator().manual_seed(seed)
    zero = model.zero_state(batch)
    return GatedDeltaNetState(torch.randn(zero.kv.shape, generator=gen) * 0.3,
                              torch.randn(zero.conv.shape, generator=gen))


def reference_lm(model: GatedDeltaNetLM, ids: torch.Tensor, kv0: torch.Tensor, conv0: torch.Tensor):
    """The whole LM token by token in float64, from fla's GatedDeltaNet layer and block."""
    cfg = model.config
    p = {k: v.double() for k, v in model.state_dict().items()}
    H, Hv, Dk, Dv = cfg.num_heads, cfg.num_v_heads, cfg.head_dim, cfg.head_v_dim

    def rms(x, w, eps=cfg.norm_eps):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    kv = [kv0[i].double().clone() for i in range(cfg.num_hidden_layers)]
    win = [conv0[i].double().clone() for i in range(cfg.num_hidden_layers)]
    logits = []
    for t in range(ids.shape[1]):
        h = p["model.embeddings.weight"][ids[:, t]]
        for i in range(cfg.num_hidden_layers):
            a = f"model.layers.{i}.attn."
            x = rms(h, p[f"model.layers.{i}.attn_norm.weight"])
            q, k, v = (x @ p[a + n + "_proj.weight"].T for n in "qkv")
            if cfg.use_short_conv:
                full = torch.cat([win[i], torch.cat([q, k, v], dim=-1).unsqueeze(-1)], dim=-1)  # (B, C, W + 1)
                weight = torch.cat([p[a + n + "_conv1d.weight"][:, 0] for n in "qkv"])
                q, k, v = F.silu((full * weight).sum(-1)).split([q.shape[-1], k.shape[-1], v.shape[-1]], dim=-1)
                win[i] = full[..., 1:]
            else:
                q, k, v = F.silu(q), F.silu(k), F.silu(v)
            # fla's l2norm: z / sqrt(sum z^2 + 1e-6); value head j reads q / k head j // (Hv / H)
            q, k = ((z / torch.sqrt(z.pow(2).sum(-1, keepdim=True) + 1e-6)).repeat_interleave(Hv // H, dim=1)
                    for z in (q.view(-1, H, Dk), k.view(-1, H, Dk)))
            v = v.view(-1, Hv, Dv)
            beta = torch.sigmoid(x @ p[a + "b_proj.weight"].T) * (2 if cfg.allow_neg_eigval else 1)
            g = -p[a + "A_log"].exp() * F.softplus(x @ p[a + "a_proj.weight"].T + p[a + "dt_bias"])
            if cfg.clamp_min is not None:  # recurlen's model-organism clamp (fla's layer has none)
                g = g.clamp(min=cfg.clamp_min)
            S = torch.exp(g)[..., None, None] * kv[i]
            S = S + beta[..., None, None] * k.unsqueeze(-1) * (v - torch.einsum("bhk,bhkv->bhv", k, S)).unsqueeze(-2)
            kv[i] = S
            o = rms(torch.einsum("bhk,bhkv->bhv", q * Dk**-0.5, S), p[a + "o_norm.weight"])
            if cfg.use_gate:
                gate = (x @ p[a + "g_proj.weight"].T).view(-1, Hv, Dv)
                o = o * (torch.sigmoid(gate) if cfg.output_gate_activation == "sigmoid" else F.silu(gate))
            h = h + o.flatten(-2) @ p[a + "o_proj.weight"].T
            m = f"model.layers.{i}.mlp."
            x = rms(h, p[f"model.layers.{i}.mlp_norm.weight"])
            hidden = F.silu(x @ p[m + "gate_proj.weight"].T) * (x @ p[m + "up_proj.weight"].T)
            h = h + hidden @ p[m + "down_proj.weight"].T
        logits.append(rms(h, p["model.norm.weight"]) @ p["lm_head.weight"].T)
    return torch.stack(logits, dim=1), torch.stack(kv), torch.stack(win)


@pytest.mark.parametrize("variant", VARIANTS)
def test_lm_equals_float64_per_token_reference(variant):
    model = sharpened(nano(**VARIANTS[variant])).double()  # the whole LM in float64: the scan's own error shows
    ids = torch.randint(0, 257, (2, 37), generator=torch.Generator().manual_seed(1))
    start = random_state(model, 2)
    start = GatedDeltaNetState(start.kv.double(), start.conv.double())
    with torch.no_grad():
        logits, state = model(ids, start)
    ref_logits, ref_kv, ref_conv = reference_lm(model, ids, start.kv, start.conv)
    # the initial state still moves the last logits (a scan that dropped it could not pass)
    from_zero = reference_lm(model, ids, torch.zeros_like(start.kv), start.conv)[0]
    assert float((ref_logits[:, -1] - from_zero[:, -1]).abs().max()) > 1e-2
    assert logits.dtype == state.kv.dtype == torch.float64
    torch.testing.assert_close(logits, ref_logits, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(state.kv, ref_kv, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(state.conv, ref_conv, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("variant", VARIANTS)
def test_split_and_step_equal_one_call(variant, split_equals_one_call, close_scaled, step_by_step):
    model = sharpened(nano(**VARIANTS[variant]))
    ids = torch.randint(0, 257, (2, 41), generator=torch.Generator().manual_seed(3))
    start = random_state(model, 2, seed=5)
    # a cut inside a chunk, a one-token call, and a remainder across a chunk boundary
    split_equals_one_call(model, ids, start, cuts=(7, 8), part_tols={"kv": 1e-5, "conv": 1e-6}, recurrent="kv",
                          backend="torch")
    with torch.no_grad():
        ref_logits, ref_state = model(ids, start)
    logits, state = step_by_step(model, ids, start)
    close_scaled(logits, ref_logits, 1e-5, "logits, step by step vs one call")
    close_scaled(state.kv, ref_state.kv, 1e-5, "final kv state, step by step vs one call")
    # later layers' windows hold inputs that carry the earlier layers' float32 rounding
    close_scaled(state.conv, ref_state.conv, 1e-5, "final conv state, step by step vs one call")


def test_state_layout():
    state = nano().zero_state(4)
    assert state.kv.shape == (2, 4, 2, 16, 32) and state.conv.shape == (2, 4, 32 + 32 + 64, 3)
    assert state.group_view("kv").shape == (2, 2, 4 * 16 * 32)  # fitted noise per (layer, value head)
    grouped = nano(num_v_heads=4).zero_state(1)
    assert grouped.kv.shape == (2, 1, 4, 16, 32) and grouped.conv.shape == (2, 1, 32 + 32 + 128, 3)
    assert nano(use_short_conv=False).zero_state(3).conv.shape == (2, 3, 0, 3)
    assert GatedDeltaNetState.RECURRENT == ("kv",) and GatedDeltaNetState.WINDOW == ("conv",)


def test_initialisation_is_fla_s():
    """fla's GatedDeltaNet init: A uniform in (0, 16), dt log-uniform in [1e-3, 0.1] behind a softplus, every linear
    N(0, 0.02) with the residual outputs NOT rescaled (fla rescales them only when asked)."""
    model = GatedDeltaNetLM(GatedDeltaNetConfig(hidden_size=256, num_heads=4, head_dim=64, num_v_heads=64,
                                                num_hidden_layers=2))
    A = torch.cat([b.attn.A_log.exp() for b in model.model.layers])
    dt = F.softplus(torch.cat([b.attn.dt_bias for b in model.model.layers]))
    assert A.min() > 0 and A.max() < 16 and A.std() > 3
    assert dt.min() >= 1e-3 * (1 - 1e-5) and dt.max() <= 0.1 * (1 + 1e-5)
    for block in model.model.layers:
        for lin in (block.attn.o_proj, block.mlp.down_proj, block.attn.q_proj):
            assert abs(float(lin.weight.detach().std()) - 0.02) < 0.002, lin


def test_slow_start_and_clamp():
    """A_init_range: A log-uniform in it, recurlen's alone (not in config.json); clamp_min: no decay below it
    however large the gate input (its export: test_a_clamped_model_is_refused_by_the_official_export)."""
    torch.manual_seed(0)
    model = GatedDeltaNetLM(GatedDeltaNetConfig(**NANO, num_v_heads=64, A_init_range=[0.001, 0.1]))
    A = torch.cat([b.attn.A_log.exp() for b in model.model.layers]).detach()
    assert A.min() >= 0.001 * (1 - 1e-6) and A.max() <= 0.1 * (1 + 1e-6)
    assert (A < 0.01).float().mean().item() == pytest.approx(0.5, abs=0.15)  # log-uniform: half below the middle
    official = model.config.to_official_json()
    assert "A_init_range" not in official
    assert GatedDeltaNetConfig.from_official_json(official).A_init_range is None
    assert GatedDeltaNetConfig.from_official_json({**official, "A_init_range": [0.001, 0.1]}).A_init_range is None
    cfg = GatedDeltaNetConfig(**NANO, A_init_range=[0.001, 0.1], clamp_min=-0.01)
    attn = GatedDeltaNetLM(cfg).model.layers[0].attn
    with torch.no_grad():
        attn.A_log.fill_(math.log(10.0))
        g, _ = attn._gates(torch.randn(3, 5, 64))
    assert float(g.min()) == pytest.approx(-0.01) and float(g.max()) == pytest.approx(-0.01)  # all bind at A = 10
    for fields, match in (({"A_init_range": [0.0, 0.1]}, "A_init_range must satisfy 0 < low"),
                          ({"A_init_range": [0.1, 0.01]}, r"A_init_range must be null or \[low, high\]"),
                          ({"clamp_min": 0.0}, "clamp_min must be null or < 0")):
        with pytest.raises(ValueError, match=match):
            GatedDeltaNetConfig(**NANO, **fields)


def test_a_clamped_model_is_refused_by_the_official_export(tmp_path):
    """fla's GatedDeltaNet layer has no clamp: fla would load a clamped export and compute another model, so the
    export refuses it in one line and writes nothing; a run's checkpoint (to_dict) and recurlen_config.json keep
    it, and a config.json that an earlier recurlen wrote with clamp_min still reads it."""
    from recurlen.util.errors import UserError

    clamped = nano(clamp_min=-0.002)
    with pytest.raises(UserError, match=r"^model config: clamp_min=-0.002 clamps the decay, which fla's GatedDeltaNet "
                                        r"config.json cannot express: .*\(clamp_min: null\)$"):
        clamped.save_pretrained(str(tmp_path / "fla"))
    assert not (tmp_path / "fla").exists()
    assert GatedDeltaNetConfig.from_dict(clamped.config.to_dict()).clamp_min == -0.002
    nano().save_pretrained(str(tmp_path / "plain"))  # unclamped: written, and fla's config.json has no clamp_min
    assert "clamp_min" not in json.loads((tmp_path / "plain" / "config.json").read_text())
    assert json.loads((tmp_path / "plain" / "recurlen_config.json").read_text())["clamp_min"] is None
    old_export = {**nano().config.to_official_json(), "clamp_min": -0.002}
    assert GatedDeltaNetConfig.from_official_json(old_export).clamp_min == -0.002


OFFICIAL_CONFIG = {
    "model_type": "gated_deltanet", "architectures": ["GatedDeltaNetForCausalLM"], "attn_mode": "chunk",
    "hidden_size": 64, "expand_v": 2, "use_gate": True, "use_short_conv": True, "allow_neg_eigval": False,
    "conv_size": 4, "head_dim": 16, "num_heads": 2, "num_v_heads": None, "max_position_embeddings": 2048,
    "hidden_ratio": 4, "intermediate_size": None, "hidden_act": "swish", "num_hidden_layers": 2, "norm_eps": 1e-06,
    "attn": None, "use_cache": True, "pad_token_id": None, "bos_token_id": 1, "eos_token_id": 2,
    "tie_word_embeddings": False, "initializer_range": 0.02, "fuse_norm": True, "fuse_swiglu": True,
    "fuse_cross_entropy": True, "fuse_linear_cross_entropy": False, "use_l2warp": False, "vocab_size": 300,
    "attnres_block_size": None, "output_gate_activation": "swish", "transformers_version": "4.57.1",
}


def _write_official(directory, *, config=None, edit=None):
    """fla's config.json and bf16 safetensors, as fla's save_pretrained writes them."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    cfg = config or OFFICIAL_CONFIG
    (directory / "config.json").write_text(json.dumps(cfg))
    torch.manual_seed(0)
    sd = {k: v.to(torch.bfloat16).contiguous() for k, v in GatedDeltaNetLM(
        GatedDeltaNetConfig.from_official_json(cfg)).state_dict().items()}
    if edit:
        edit(sd)
    save_file(sd, str(directory / "model.safetensors"))
    return sd


def test_official_directory_loads_strictly(tmp_path):
    sd = _write_official(tmp_path / "ckpt")
    model = GatedDeltaNetLM.from_pretrained(str(tmp_path / "ckpt"), backend="torch")
    cfg = model.config
    assert (cfg.key_dim, cfg.head_v_dim, cfg.num_v_heads, cfg.mlp_size) == (32, 32, 2, 256)
    assert torch.equal(model.model.layers[1].attn.A_log, sd["model.layers.1.attn.A_log"].float())
    logits, state = model(torch.randint(0, 300, (1, 9)))
    assert logits.shape == (1, 9, 300) and state.kv.shape == (2, 1, 2, 16, 32)


@pytest.mark.parametrize("edit,match", [
    (lambda sd: sd.pop("model.layers.1.attn.dt_bias"), r"missing \['model.layers.1.attn.dt_bias'\]"),
    (lambda sd: sd.__setitem__("model.layers.0.attn.v_proj.weight", torch.zeros(32, 64)),
     r"model.layers.0.attn.v_proj.weight has shape \(32, 64\), the config needs \(64, 64\)"),
])
def test_bad_checkpoints_name_the_problem(tmp_path, edit, match):
    _write_official(tmp_path / "bad", edit=edit)
    with pytest.raises(ValueError, match=match):
        GatedDeltaNetLM.from_pretrained(str(tmp_path / "bad"))


def test_unsupported_configs_are_refused_clearly():
    with pytest.raises(ValueError, match="model_type is 'gla'"):
        GatedDeltaNetConfig.from_official_json({**OFFICIAL_CONFIG, "model_type": "gla"})
    with pytest.raises(ValueError, match=r"attn=\{'layers': \[1\]\} \(hybrid attention layers\) is not supported"):
        GatedDeltaNetConfig.from_official_json({**OFFICIAL_CONFIG, "attn": {"layers": [1]}})
    with pytest.raises(ValueError, match="attnres_block_size=4 is not supported"):
        GatedDeltaNetConfig.from_official_json({**OFFICIAL_CONFIG, "attnres_block_size": 4})
    with pytest.raises(ValueError, match="num_v_heads=3 must be a multiple of num_heads=2"):
        GatedDeltaNetConfig(num_heads=2, num_v_heads=3)
    with pytest.raises(ValueError, match="output_gate_activation='relu'"):
        GatedDeltaNetConfig(output_gate_activation="relu")


def test_saved_config_is_fla_s_and_fla_s_parameter_shapes(tmp_path):
    model = nano(num_v_heads=4, allow_neg_eigval=True)
    model.save_pretrained(str(tmp_path / "out"))
    official = json.loads((tmp_path / "out" / "config.json").read_text())
    assert official["model_type"] == "gated_deltanet" and "chunk_size" not in official
    assert GatedDeltaNetConfig.from_official_json(official) == GatedDeltaNetConfig.from_dict(
        {**model.config.to_dict(), "chunk_size": 64})
    # a layer of fla's 1.3B recipe (hidden 2048, 6 heads of 256, expand_v 2): its documented ~6 D^2 parameters
    big = GatedDeltaNetLM(GatedDeltaNetConfig(hidden_size=2048, num_heads=6, head_dim=256, num_hidden_layers=1),
                          backend="torch")
    shapes = {k: tuple(v.shape) for k, v in big.state_dict().items()}
    assert shapes["model.layers.0.attn.q_proj.weight"] == (1536, 2048)
    assert shapes["model.layers.0.attn.v_proj.weight"] == (3072, 2048)
    assert shapes["model.layers.0.attn.a_proj.weight"] == (6, 2048)
    assert shapes["model.layers.0.attn.q_conv1d.weight"] == (1536, 1, 4)
    assert shapes["model.layers.0.attn.o_norm.weight"] == (512,)
    per_layer = sum(v.numel() for k, v in big.state_dict().items() if k.startswith("model.layers.0.attn."))
    assert math.isclose(per_layer / 2048**2, 6.0, rel_tol=0.01)


def test_what_each_part_carries_across_a_cut(close_scaled):
    """Carried whole, a cut is invisible; zeroing either part changes the next token (the windows hold the conv's
    last three inputs, read by the first outputs after the cut; docs/interventions.md measures what each costs)."""
    model = sharpened(nano())
    x, cut = torch.randint(0, 257, (2, 40), generator=torch.Generator().manual_seed(7)), 24
    with torch.no_grad():
        full, _ = model(x, random_state(model, 2))
        _, state = model(x[:, :cut], random_state(model, 2))
        close_scaled(model(x[:, cut:], state)[0], full[:, cut:], 1e-5, "logits after a cut, everything carried")
        for part in GatedDeltaNetState.part_names():
            zeroed = GatedDeltaNetState(**{**state.parts(), part: torch.zeros_like(getattr(state, part))})
            assert (model(x[:, cut:], zeroed)[0][:, 0] - full[:, cut]).abs().max() > 1e-3, part
