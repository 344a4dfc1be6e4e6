"""RWKV-6: the chunked WKV scan against an independent float64 recurrence (outputs, final state, every gradient
including the initial state's and the bonus's), its state layout and what the token-shift windows carry, both
checkpoint formats with their one-line errors, and the model table's rows (the contract every architecture shares is
tests/models/test_architectures.py; parity with the `rwkv` package is test_rwkv6_reference.py)."""

import json

import pytest
import torch

from recurlen.models import registry, table
from recurlen.models.rwkv6 import RWKV6LM, RWKV6Config, RWKV6State, preset
from recurlen.models.rwkv6.checkpoint import BLINKDL_FILE, blinkdl_read, blinkdl_write
from recurlen.models.rwkv6.kernels import layout_kwargs
from recurlen.models.rwkv6.scan import wkv6_chunked
from recurlen.util.errors import UserError

F64 = torch.float64


def recurrence(r, k, v, g, u, h0):
    """o_t = r_t (S_t-1 + diag(u) k_t^T v_t), S_t = diag(exp g_t) S_t-1 + k_t^T v_t, token by token."""
    S, outs = h0, []
    for t in range(r.shape[1]):
        kv = k[:, t].unsqueeze(-1) * v[:, t].unsqueeze(-2)
        outs.append(torch.einsum("bhk,bhkv->bhv", r[:, t], S + u.unsqueeze(-1) * kv))
        S = torch.exp(g[:, t]).unsqueeze(-1) * S + kv
    return torch.stack(outs, dim=1), S


def _inputs(batch=2, length=45, heads=3, dk=4, dv=5, seed=0, decay_scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    kw = dict(dtype=F64, generator=gen)
    r, k = torch.randn(batch, length, heads, dk, **kw), torch.randn(batch, length, heads, dk, **kw)
    v = torch.randn(batch, length, heads, dv, **kw)
    g = -torch.exp(torch.randn(batch, length, heads, dk, **kw)) * decay_scale  # RWKV-6's log decay -exp(w)
    u = torch.randn(heads, dk, **kw)
    h0 = torch.randn(batch, heads, dk, dv, **kw)
    return [r, k, v, g, u, h0]


def _loss_grads(fn, inputs, seed=4):
    gen = torch.Generator().manual_seed(seed)
    o, S = fn(*inputs)
    w_o = torch.randn(o.shape, dtype=F64, generator=gen)
    w_s = torch.randn(S.shape, dtype=F64, generator=gen)
    return o, S, torch.autograd.grad((o * w_o).sum() + (S * w_s).sum(), inputs)


@pytest.mark.parametrize("chunk_size", [1, 5, 16, 64])
@pytest.mark.parametrize("length", [1, 17, 45, 100])
def test_chunked_wkv_equals_recurrence_outputs_states_and_all_gradients(chunk_size, length):
    inputs = [t.requires_grad_() for t in _inputs(length=length)]
    o_ref, S_ref, g_ref = _loss_grads(recurrence, inputs)
    o, S, g = _loss_grads(lambda r, k, v, gg, u, h0: wkv6_chunked(r, k, v, gg, u, chunk_size=chunk_size,
                                                                  initial_state_BHKV=h0), inputs)
    assert o.dtype == F64
    torch.testing.assert_close(o, o_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(S, S_ref, rtol=1e-10, atol=1e-10)
    for name, got, want in zip(("r", "k", "v", "g", "u", "h0"), g, g_ref):
        assert float(want.abs().max()) > 0, f"gradient of {name} is zero: the test would not see it"
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9, msg=f"gradient of {name}")


def test_strong_decays_stay_finite_and_exact_in_float32(close_scaled):
    # Log decays of -5 e^N(0,1) per step (a trained model's strongest are about -e^2): a chunk of 64 decays by far
    # more than e^-88, which any factorisation of exp(e_t - b_s) into exp(e_t) exp(-b_s) over a chunk overflows.
    r, k, v, g, u, h0 = _inputs(length=130, decay_scale=5.0)
    o64, S64 = recurrence(r, k, v, g, u, h0)
    o32, S32 = wkv6_chunked(*(t.float() for t in (r, k, v, g, u)), chunk_size=64, initial_state_BHKV=h0.float())
    assert torch.isfinite(o32).all()
    # float32 cumulative log decays of a few thousand lose digits in their differences: 1e-4 of the output's scale.
    close_scaled(o32, o64, 1e-4, "outputs")
    close_scaled(S32, S64, 1e-5, "final state")


# ---------------------------------------------------------------------------------- the LM and its state
def random_lm(seed: int = 0, **fields) -> RWKV6LM:
    """The nano shape with weights far from the from-scratch init (every mix, the bonus and the norms random), so
    that a swapped or dropped term moves the logits visibly; decays slow enough that the state matters."""
    torch.manual_seed(seed)
    model = RWKV6LM(preset("nano", **fields), backend="torch").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * (0.3 if p.dim() > 1 else 0.5) + (1.0 if "norm.weight" in name else 0.0))
        for block in model.model.layers:
            block.attn.w_proj.linear.lora[2].bias.uniform_(-4.0, 0.0)
    return model


def test_state_layout_and_what_the_windows_hold():
    model = random_lm()
    zero = model.zero_state(3)
    assert isinstance(zero, RWKV6State) and zero.wkv.shape == (2, 3, 2, 32, 32) and zero.wkv.dtype == torch.float32
    assert zero.att_shift.shape == zero.ffn_shift.shape == (2, 3, 64)
    assert RWKV6State.RECURRENT == ("wkv",) and RWKV6State.WINDOW == ("att_shift", "ffn_shift")
    ids = torch.randint(0, 257, (3, 12))
    with torch.no_grad():
        _, state = model(ids)
    # The time mix's window is the last token's normalised input of the first block.
    block = model.model.layers[0]
    torch.testing.assert_close(state.att_shift[0], block.attn_norm(block.pre_norm(model.model.embeddings(ids[:, -1]))))


def test_dropping_the_windows_changes_the_logits_after_a_cut(close_scaled):
    """What recurrent_only() costs for RWKV-6: carried, the shifts make a cut invisible; zeroed, the first token
    after the cut mixes with a zero instead of its predecessor, and its logits move."""
    model = random_lm()
    ids = torch.randint(0, 257, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full, _ = model(ids)
        _, mid = model(ids[:, :20])
        kept, _ = model(ids[:, 20:], mid)
        dropped, _ = model(ids[:, 20:], mid.recurrent_only())
    close_scaled(kept, full[:, 20:], 1e-5, "logits after the cut, windows carried")
    gap = (dropped - full[:, 20:]).abs().amax(dim=(0, 2))
    assert gap[0] > 1e-3, "zeroed token shifts must change the first token after the cut"


# ---------------------------------------------------------------------------------- checkpoints
def test_blinkdl_file_round_trip_is_exact_and_detected(tmp_path):
    model = random_lm()
    path = BLINKDL_FILE.save(model, tmp_path / "RWKV-x060-test.pth")
    raw = torch.load(path, weights_only=True)
    assert raw["blocks.0.att.time_maa_w1"].shape == (64, 5 * 8) and raw["blocks.0.att.time_maa_w2"].shape == (5, 8, 64)
    assert raw["blocks.1.att.time_decay"].shape == (1, 1, 64) and raw["blocks.0.att.time_faaaa"].shape == (2, 32)
    assert "blocks.0.ln0.weight" in raw and "blocks.1.ln0.weight" not in raw
    assert registry.detect(path).name == "rwkv6"
    loaded = RWKV6LM.from_pretrained(str(path), backend="torch")
    assert loaded.config.head_norm_eps == 64e-5 and loaded.config.num_hidden_layers == 2
    assert loaded.config.proj_low_rank_dim == 8 and loaded.config.gate_low_rank_dim == 16
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    # BlinkDL's mix order (w, k, v, r, g) lands in fla's (r, w, k, v, g).
    assert torch.equal(loaded.model.layers[1].attn.x_bias[0], raw["blocks.1.att.time_maa_r"].view(-1))
    assert torch.equal(loaded.model.layers[1].attn.x_bias[1], raw["blocks.1.att.time_maa_w"].view(-1))


@pytest.mark.parametrize("edit,match", [
    (lambda sd: sd.__setitem__("blocks.0.att.time_state", torch.zeros(2, 32, 32)),
     r"keys recurlen's RWKV-6 does not have: \['blocks.0.att.time_state'\]"),
    (lambda sd: sd.pop("blocks.1.att.time_maa_g"), r"block 1 lacks \['att.time_maa_g'\]"),
    (lambda sd: sd.pop("blocks.1.att.gate.weight"), r"missing \['model.layers.1.attn.g_proj.linear.weight'\]"),
    (lambda sd: sd.pop("blocks.0.att.time_faaaa"), r"not an RWKV-6 \(Finch\) checkpoint"),
    (lambda sd: sd.__setitem__("blocks.1.ffn.key.weight", torch.zeros(64, 64)),
     r"model.layers.1.ffn.key.linear.weight has shape \(64, 64\), the config needs \(128, 64\)"),
])
def test_bad_blinkdl_files_name_the_problem(tmp_path, edit, match):
    sd = blinkdl_write(random_lm())
    edit(sd)
    torch.save(sd, tmp_path / "bad.pth")
    with pytest.raises(UserError, match=match):
        RWKV6LM.from_pretrained(str(tmp_path / "bad.pth"))


def test_a_file_of_another_format_is_refused_in_one_line(tmp_path):
    (tmp_path / "x.bin").write_bytes(b"junk")
    with pytest.raises(UserError, match=r"x.bin is a file; RWKV6LM loads a .pth file or a directory"):
        RWKV6LM.from_pretrained(str(tmp_path / "x.bin"))
    torch.save({"w": torch.zeros(1)}, tmp_path / "other.pth")
    # The list names every architecture that reads a single weights file (RWKV-6's .pth among them).
    with pytest.raises(UserError, match=r"not a weights file of a known architecture \([^)]*rwkv6: .pth[^)]*\)"):
        registry.detect(tmp_path / "other.pth")


def test_fla_directory_round_trip_and_config(tmp_path):
    model = random_lm()
    model.save_pretrained(str(tmp_path / "fla"))
    official = json.loads((tmp_path / "fla" / "config.json").read_text())
    assert official["model_type"] == "rwkv6" and "head_norm_eps" not in official and official["attn"] is None
    assert registry.detect(tmp_path / "fla").name == "rwkv6"
    loaded = RWKV6LM.from_pretrained(str(tmp_path / "fla"), backend="torch")
    assert loaded.config == model.config
    ids = torch.randint(0, 257, (1, 9))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids)[0], model(ids)[0], rtol=0, atol=0)
    # config.json alone (fla's reader): the GroupNorm eps is fla's norm_eps.
    (tmp_path / "fla" / "recurlen_config.json").unlink()
    assert RWKV6LM.from_pretrained(str(tmp_path / "fla")).config.group_norm_eps == 1e-5


FLA_HUB_7B = {  # fla-hub/rwkv6-7B-finch's config.json, as published (older fla keys included)
    "_name_or_path": "fla-hub/rwkv6-7B-finch", "architectures": ["RWKV6ForCausalLM"], "attn_mode": "chunk",
    "bos_token_id": 0, "clamp_min": None, "conv_size": 4, "eos_token_id": 0, "expand_k": 1, "expand_v": 1,
    "fuse_cross_entropy": True, "fuse_norm": True, "gate_low_rank_dim": 128, "hidden_act": "sqrelu",
    "hidden_ratio": 3.5, "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": None,
    "max_position_embeddings": 2048, "model_type": "rwkv6", "norm_bias": True, "norm_eps": 1e-05, "norm_first": True,
    "num_heads": 64, "num_hidden_layers": 32, "proj_low_rank_dim": 64, "share_conv_kernel": True,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.40.2", "use_cache": True,
    "use_glu": False, "vocab_size": 65536}


def test_the_fla_hub_7b_config_is_the_7b_row():
    cfg = RWKV6Config.from_official_json(FLA_HUB_7B)
    assert RWKV6Config.recognises(FLA_HUB_7B)
    row = preset("7b")
    for name in ("hidden_size", "num_hidden_layers", "num_heads", "proj_low_rank_dim", "gate_low_rank_dim",
                 "vocab_size", "ffn_size", "head_dim"):
        assert getattr(cfg, name) == getattr(row, name), name
    # fla's reader keeps fla's GroupNorm eps; BlinkDL's files (and the rows) use 64e-5.
    assert cfg.group_norm_eps == 1e-5 and row.group_norm_eps == 64e-5


def test_unsupported_configs_are_refused_clearly():
    with pytest.raises(ValueError, match="use_short_conv=True is not supported"):
        RWKV6Config.from_official_json({**FLA_HUB_7B, "use_short_conv": True})
    good = RWKV6Config().to_official_json()
    with pytest.raises(ValueError, match="model_type is 'gla'"):
        RWKV6Config.from_official_json({**good, "model_type": "gla"})
    with pytest.raises(ValueError, match=r"attn=\{'layers': \[1\]\} \(hybrid attention layers\) is not supported"):
        RWKV6Config.from_official_json({**good, "attn": {"layers": [1]}})
    with pytest.raises(ValueError, match="hidden_act='swish' is not supported"):
        RWKV6Config(hidden_act="swish")
    with pytest.raises(ValueError, match="key_dim=64 must be a positive multiple of num_heads=3"):
        RWKV6Config(hidden_size=64, num_heads=3)


def test_official_world_rows_have_the_release_shapes():
    rows = {row.name: row for row in table.rows("rwkv6")}
    assert set(rows) == {"rwkv6-nano", "rwkv6-tiny", "rwkv6-1.6b", "rwkv6-3b", "rwkv6-7b"}
    for name in ("rwkv6-1.6b", "rwkv6-3b", "rwkv6-7b"):
        assert rows[name].hub_id == "BlinkDL/rwkv-6-world" and rows[name].train_seq_len == 4096
        assert table.official(f"/models/{rows[name].hub_file}") is rows[name]
    assert table.official("/hub/models--BlinkDL--rwkv-6-world") is None  # the repository holds all three sizes
    cfg = preset("1.6b")
    assert (cfg.head_dim, cfg.ffn_size, cfg.vocab_size) == (64, 7168, 65536)
    with torch.device("meta"):
        big = RWKV6LM(cfg, backend="torch")
    assert 1.55e9 < big.num_parameters() < 1.65e9
    assert preset("7b").head_dim == 64 and preset("3b").head_dim == 64


def test_decay_bias_starts_spread_over_the_range_or_at_zero():
    torch.manual_seed(0)
    zero = RWKV6LM(preset("nano"))
    assert all(torch.count_nonzero(b.attn.w_proj.linear.lora[2].bias) == 0 for b in zero.layers)
    for fields, (lo, hi) in (({"decay_init_range": [-6.0, -1.0]}, (-6.0, -1.0)),
                             ({"decay_init_range": [-8.0, -4.0]}, (-8.0, -4.0))):
        bias = RWKV6LM(preset("nano", **fields)).layers[0].attn.w_proj.linear.lora[2].bias.detach()
        per_head = bias.view(2, 32)
        assert torch.equal(per_head[0], per_head[1])  # every head spans the range
        assert float(per_head.min()) == lo and float(per_head.max()) == hi
    assert "decay_init_range" not in preset("nano", decay_init_range=[-6.0, -1.0]).to_official_json()


def test_kernel_layout_arguments_follow_the_installed_signature():
    def new(r, k, v, w, u, scale=None, initial_state=None, output_final_state=False): ...

    def old(r, k, v, w, u, scale=None, initial_state=None, output_final_state=False, head_first=True): ...

    assert layout_kwargs(new) == {} and layout_kwargs(old) == {"head_first": False}


def test_a_world_row_loads_its_file_from_the_local_hub_cache(tmp_path, monkeypatch):
    """model=rwkv6-1.6b names one file of BlinkDL/rwkv-6-world (the repository holds every size and no config.json):
    it loads from a Hugging Face cache that holds that file alone, offline, and states the release's context."""
    import huggingface_hub.constants as hf_constants

    from recurlen.training.experiments.compose import load_experiment
    from recurlen.training.run_dir import load_model

    world = table.find("rwkv6-1.6b")
    repo = tmp_path / "hub" / "models--BlinkDL--rwkv-6-world"
    model = random_lm()
    BLINKDL_FILE.save(model, repo / "snapshots" / ("b" * 40) / world.hub_file)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("b" * 40)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    cfg, _ = load_experiment(["model=rwkv6-1.6b"])
    assert cfg.model.pretrained == f"BlinkDL/rwkv-6-world/{world.hub_file}" == world.pretrained
    loaded = load_model(cfg.model.pretrained, backend="torch")
    assert isinstance(loaded.model, RWKV6LM) and loaded.train_seq_len == 4096
    for name, p in model.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[name], p), name
    direct = RWKV6LM.from_pretrained(cfg.model.pretrained, backend="torch")
    assert torch.equal(direct.lm_head.weight, model.lm_head.weight)
    absent = table.find("rwkv6-3b").pretrained
    with pytest.raises(UserError, match=r"'BlinkDL/rwkv-6-world/RWKV-x060-World-3B-.*\.pth' is not in the local "
                       r"Hugging Face cache .* HF_HUB_OFFLINE=1 is set.*hf download BlinkDL/rwkv-6-world RWKV-x060"):
        load_model(absent, backend="torch")


def test_blinkdl_reader_refuses_a_non_rwkv6_state_dict():
    with pytest.raises(UserError, match="not an RWKV-6"):
        blinkdl_read({"emb.weight": torch.zeros(3, 4)}, "x.pth")


def test_a_pth_file_loads_where_commands_take_a_checkpoint(tmp_path):
    """`model.pretrained=` / `recurlen eval` take BlinkDL's file; named as a world release, it states its context."""
    from recurlen.commands.preflight import describe_checkpoint
    from recurlen.training.run_dir import load_model

    model = random_lm()
    world = table.find("rwkv6-1.6b")
    path = BLINKDL_FILE.save(model, tmp_path / "own.pth")
    loaded = load_model(str(path), backend="torch")
    assert isinstance(loaded.model, RWKV6LM) and loaded.train_seq_len is None
    assert describe_checkpoint(str(path)) == f"{path} (RWKV-6 weights file)"
    named = BLINKDL_FILE.save(model, tmp_path / world.hub_file)
    assert load_model(str(named), backend="torch").train_seq_len == 4096
    (tmp_path / "junk.pt").write_bytes(b"junk")
    with pytest.raises(UserError, match="neither a .ckpt checkpoint nor a weights file of a known architecture"):
        describe_checkpoint(str(tmp_path / "junk.pt"))
