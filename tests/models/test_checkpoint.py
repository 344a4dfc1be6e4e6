"""Official-format checkpoints (config.json + fp16 pytorch_model.bin) and tokenizers, from fixtures."""

import json

import pytest
import torch

from recurlen import Mamba2LM, preset
from recurlen.models import registry
from recurlen.models.mamba2.config import Mamba2Config
from recurlen.training.run_dir import load_model
from recurlen.util.errors import UserError
from recurlen.util.tokenizers import ByteTokenizer, HFTokenizer, check_vocab_fits, load_tokenizer

OFFICIAL_CONFIG = {
    "d_model": 64, "d_intermediate": 0, "n_layer": 2, "vocab_size": 300,
    "ssm_cfg": {"layer": "Mamba2", "d_state": 16, "headdim": 16, "ngroups": 2, "chunk_size": 32},
    "attn_layer_idx": [], "attn_cfg": {}, "rms_norm": True, "residual_in_fp32": True, "fused_add_norm": True,
    "pad_vocab_size_multiple": 16, "tie_embeddings": True,
}


def _write_official(directory, *, drop_head=False, config=None, state_dict=None):
    """What a state-spaces/mamba2-* repo holds: fp16 weights, both tied keys present."""
    directory.mkdir(parents=True, exist_ok=True)
    cfg = config or OFFICIAL_CONFIG
    (directory / "config.json").write_text(json.dumps(cfg))
    torch.manual_seed(0)
    if state_dict is None:
        model = Mamba2LM(Mamba2Config.from_official_json(cfg))
        state_dict = {k: v.half().clone() for k, v in model.state_dict().items()}
    if drop_head:
        state_dict.pop("lm_head.weight")
    torch.save(state_dict, directory / "pytorch_model.bin")
    return state_dict


@pytest.mark.parametrize("drop_head", [False, True])
def test_load_official_directory(tmp_path, drop_head):
    sd = _write_official(tmp_path / "ckpt", drop_head=drop_head)
    model = Mamba2LM.from_pretrained(str(tmp_path / "ckpt"), backend="torch")
    cfg = model.config
    assert (cfg.d_model, cfg.n_layer, cfg.ngroups, cfg.padded_vocab_size) == (64, 2, 2, 304)
    assert model.backbone.embedding.weight.dtype == torch.float32
    assert torch.equal(model.backbone.embedding.weight, sd["backbone.embedding.weight"].float())
    assert torch.equal(model.backbone.layers[1].mixer.A_log, sd["backbone.layers.1.mixer.A_log"].float())
    assert model.lm_head.weight is model.backbone.embedding.weight
    logits, state = model(torch.randint(0, 300, (1, 9)))
    assert logits.shape == (1, 9, 300) and state.ssm.shape == (2, 1, 8, 16, 16)


def test_parameter_names_match_official_layout():
    model = Mamba2LM(preset("130m"), backend="torch")
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert shapes["backbone.embedding.weight"] == (50288, 768)
    assert shapes["backbone.layers.0.mixer.in_proj.weight"] == (2 * 1536 + 2 * 128 + 24, 768)
    assert shapes["backbone.layers.0.mixer.conv1d.weight"] == (1536 + 256, 1, 4)
    assert shapes["backbone.layers.23.mixer.norm.weight"] == (1536,)
    assert shapes["backbone.layers.0.mixer.A_log"] == (24,)
    assert shapes["lm_head.weight"] == (50288, 768)
    assert 125e6 < model.num_parameters() < 135e6  # tied weights counted once


def test_official_presets_have_official_shapes():
    assert {k: (v["d_model"], v["n_layer"]) for k, v in registry.get("mamba2").presets.items()
            if v.get("vocab_size") == 50277} == {
        "130m": (768, 24), "370m": (1024, 48), "780m": (1536, 48), "1.3b": (2048, 48), "2.7b": (2560, 64)}


def test_saved_config_json_is_the_official_one_and_recurlen_s_fields_survive(tmp_path, nano_model):
    model = nano_model(A_init_range=(0.01, 1.0), A_init_log_uniform=True)
    model.save_pretrained(str(tmp_path / "out"))
    official = json.loads((tmp_path / "out" / "config.json").read_text())
    assert official["ssm_cfg"]["layer"] == "Mamba2" and "recurlen" not in official
    assert "A_init_log_uniform" not in json.dumps(official)  # mamba-ssm's config has no such field: recurlen's own
    assert Mamba2LM.from_pretrained(str(tmp_path / "out")).config == model.config  # from recurlen_config.json


def test_load_model_from_official_dir(tmp_path):
    _write_official(tmp_path / "mamba2-tiny")
    loaded = load_model(str(tmp_path / "mamba2-tiny"))
    assert loaded.model.config.vocab_size == 300 and loaded.tokenizer is None


def test_hub_id_resolves_through_local_cache(tmp_path, monkeypatch):
    import huggingface_hub.constants as hf_constants

    cache = tmp_path / "hub"
    snap = cache / "models--state-spaces--mamba2-fixture" / "snapshots" / ("a" * 40)
    _write_official(snap)
    (cache / "models--state-spaces--mamba2-fixture" / "refs").mkdir(parents=True)
    (cache / "models--state-spaces--mamba2-fixture" / "refs" / "main").write_text("a" * 40)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = Mamba2LM.from_pretrained("state-spaces/mamba2-fixture")
    assert model.config.d_model == 64
    with pytest.raises(UserError, match=f"'state-spaces/mamba2-absent' is not in the local Hugging Face cache "
                       f"\\({cache}\\) and HF_HUB_OFFLINE=1 is set.*`HF_HOME=.* hf download "
                       "state-spaces/mamba2-absent`"):
        Mamba2LM.from_pretrained("state-spaces/mamba2-absent")


def test_bad_checkpoints_raise_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Mamba2LM.from_pretrained(str(tmp_path / "nowhere" / "deeper"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        Mamba2LM.from_pretrained(str(tmp_path / "empty"))
    (tmp_path / "noweights").mkdir()
    (tmp_path / "noweights" / "config.json").write_text(json.dumps(OFFICIAL_CONFIG))
    with pytest.raises(FileNotFoundError, match="neither pytorch_model.bin nor model.safetensors"):
        Mamba2LM.from_pretrained(str(tmp_path / "noweights"))
    mamba1 = {**OFFICIAL_CONFIG, "ssm_cfg": {"layer": "Mamba1"}}
    (tmp_path / "m1").mkdir()
    (tmp_path / "m1" / "config.json").write_text(json.dumps(mamba1))
    with pytest.raises(ValueError, match="ssm_cfg.layer is 'Mamba1'; recurlen supports only 'Mamba2'"):
        Mamba2LM.from_pretrained(str(tmp_path / "m1"))
    hybrid = {**OFFICIAL_CONFIG, "attn_layer_idx": [1]}
    with pytest.raises(ValueError, match="hybrid attention"):
        Mamba2Config.from_official_json(hybrid)
    with pytest.raises(ValueError, match="unknown ssm_cfg keys \\['d_stat'\\]"):
        Mamba2Config.from_official_json({**OFFICIAL_CONFIG, "ssm_cfg": {"layer": "Mamba2", "d_stat": 3}})
    sd = _write_official(tmp_path / "ok")
    bad = dict(sd)
    bad["backbone.layers.0.mixer.A_log"] = torch.zeros(3, dtype=torch.float16)
    _write_official(tmp_path / "shape", state_dict=bad)
    with pytest.raises(ValueError, match=r"backbone.layers.0.mixer.A_log has shape \(3,\), the config needs \(8,\)"):
        Mamba2LM.from_pretrained(str(tmp_path / "shape"))
    missing = {k: v for k, v in sd.items() if "layers.1" not in k}
    _write_official(tmp_path / "missing", state_dict=missing)
    with pytest.raises(ValueError, match="missing \\['backbone.layers.1"):
        Mamba2LM.from_pretrained(str(tmp_path / "missing"))
    (tmp_path / "ok" / "pytorch_model.bin").write_bytes(b"not a checkpoint")
    with pytest.raises(UserError, match=r"ok/pytorch_model.bin cannot be loaded: it is damaged, truncated or not a "):
        Mamba2LM.from_pretrained(str(tmp_path / "ok"))
    # Truncated (a copy cut short) and empty: one line naming the file, never torch's weights_only=False advice.
    _write_official(tmp_path / "cut")
    weights = tmp_path / "cut" / "pytorch_model.bin"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(UserError, match=r"cut/pytorch_model.bin cannot be loaded: it is damaged or truncated") as err:
        Mamba2LM.from_pretrained(str(tmp_path / "cut"))
    assert "weights_only" not in str(err.value) and "\n" not in str(err.value)
    weights.write_bytes(b"")
    with pytest.raises(UserError, match=r"cut/pytorch_model.bin cannot be loaded: the file is empty"):
        Mamba2LM.from_pretrained(str(tmp_path / "cut"))


def test_byte_tokenizer_round_trip_and_bad_bytes():
    tok = ByteTokenizer()
    text = "def f(x):\n    return 'héllo'"
    assert tok.decode(tok.encode(text)) == text
    raw = b"ok \xff\xfe bytes".decode("utf-8", errors="surrogateescape")
    assert tok.encode(raw) == list(b"ok \xff\xfe bytes")
    assert "ok" in tok.decode(tok.encode(raw) + [tok.eos_id])
    with pytest.raises(ValueError, match="vocabulary holds 200"):
        check_vocab_fits(tok, 200)


def test_hf_tokenizer_from_tokenizer_json(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<|endoftext|>": 0, "[UNK]": 1, "hello": 2, "world": 3, "passkey": 4}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.save(str(tmp_path / "tokenizer.json"))
    tok = load_tokenizer(str(tmp_path))
    assert isinstance(tok, HFTokenizer)
    assert tok.encode("hello world passkey") == [2, 3, 4]
    assert tok.eos_id == 0 and tok.vocab_size == 5
    assert load_tokenizer(str(tmp_path / "tokenizer.json")).encode("world") == [3]
    with pytest.raises(ValueError, match="unknown tokenizer 'nope'"):
        load_tokenizer("nope")
