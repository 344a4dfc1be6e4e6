"""transformers' format of every architecture that has one (Mamba-2 and Mamba-1: Mamba2ForCausalLM,
MambaForCausalLM): what recurlen writes, transformers loads with the same logits; what transformers writes, recurlen
loads with the same logits; what recurlen cannot run is refused by name. (The export command's round trips:
tests/commands/test_export.py.)"""

import json

import pytest
import torch

from recurlen.models import registry, transformers_format

ARCHS = [name for name, a in registry.architectures().items() if a.transformers_format is not None]
"""The architectures transformers has a class for (their registry entry's transformers_format)."""
IDS = torch.randint(0, 100, (2, 72), generator=torch.Generator().manual_seed(0))


def perturbed(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every parameter moved off its initialisation (norm weights off 1, D off 1): a swapped or dropped one shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model


def test_every_declared_transformers_format_is_a_class_transformers_has():
    transformers = pytest.importorskip("transformers")
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    assert ARCHS  # Mamba-2's at least: the export and load paths below are tested on something
    for name in ARCHS:
        fmt = registry.get(name).transformers_format
        assert fmt.model_type in CONFIG_MAPPING and hasattr(transformers, fmt.class_name), name


@pytest.mark.parametrize("name", ARCHS)
def test_transformers_loads_what_recurlen_writes_with_the_same_logits(tmp_path, nano_model, close_scaled, name):
    transformers = pytest.importorskip("transformers")
    model = perturbed(nano_model(name), seed=1)
    fmt = registry.get(name).transformers_format
    transformers_format.save(model, tmp_path, fmt)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == fmt.model_type and config["vocab_size"] == model.config.padded_vocab_size
    # transformers' own class, not its Auto classes: importing fla (the GLA / Gated DeltaNet kernels) re-registers
    # the model types mamba and mamba2 with fla's classes for the rest of the process.
    hf = getattr(transformers, fmt.class_name).from_pretrained(tmp_path).eval()
    assert type(hf).__module__.startswith("transformers.")
    with torch.no_grad():
        ours = model(IDS)[0]
        theirs = hf(IDS).logits
    close_scaled(theirs[..., :model.config.vocab_size], ours, 1e-4, f"{name}: transformers vs recurlen")

    (tmp_path / "recurlen_config.json").unlink()  # transformers' files alone, as a published model has them
    back = registry.detect(tmp_path).load_pretrained(tmp_path, backend="torch")
    assert back.config.vocab_size == model.config.padded_vocab_size  # transformers' embedding has no padding
    with torch.no_grad():
        assert torch.equal(back(IDS)[0][..., :model.config.vocab_size], ours)


def _hf_config(transformers, name: str):
    """transformers' config of the architecture's nano shape with its first variant (Mamba-2: two groups), an
    untied head and an unpadded vocabulary of 100: the paths a tied, padded nano model never reads are read."""
    a = registry.get(name)
    raw = a.transformers_format.config_json(a.preset("nano", **(dict(a.variants[0]) if a.variants else {})))
    raw.pop("architectures")
    assert raw.pop("model_type") == a.transformers_format.model_type
    return getattr(transformers, a.transformers_format.class_name).config_class(
        **{**raw, "vocab_size": 100, "tie_word_embeddings": False})


@pytest.mark.parametrize("name", ARCHS)
def test_recurlen_loads_what_transformers_writes_with_the_same_logits(tmp_path, close_scaled, name):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf_cls = getattr(transformers, registry.get(name).transformers_format.class_name)
    hf = perturbed(hf_cls(_hf_config(transformers, name)), seed=2).eval()
    hf.save_pretrained(tmp_path)  # transformers' own config.json (non-default fields only) and model.safetensors
    assert (tmp_path / "model.safetensors").is_file() and not (tmp_path / "recurlen_config.json").exists()
    a = registry.detect(tmp_path)
    assert a.name == name
    model = a.load_pretrained(tmp_path, backend="torch").eval()
    assert model.config.tie_embeddings == hf.config.tie_word_embeddings
    with torch.no_grad():
        close_scaled(model(IDS)[0], hf(IDS).logits, 1e-4, f"{name}: recurlen vs transformers' own files")


@pytest.mark.parametrize("name", ARCHS)
def test_the_declared_defaults_are_transformers_own(name):
    """A config.json that leaves a field out means transformers' default (older or hand-written files do)."""
    transformers = pytest.importorskip("transformers")
    fmt = registry.get(name).transformers_format
    theirs = getattr(transformers, fmt.class_name).config_class()
    for f in fmt.fields:
        if f.default != "auto":  # time_step_rank: computed from hidden_size by both
            assert transformers_format._plain(f.default) == transformers_format._plain(getattr(theirs, f.theirs)), \
                f.theirs


def test_a_transformers_config_recurlen_cannot_run_is_refused_by_name():
    fmt = registry.get("mamba2").transformers_format
    cls = registry.get("mamba2").config_cls
    good = {"model_type": "mamba2", "hidden_size": 64, "num_heads": 8, "head_dim": 16, "n_groups": 1,
            "num_hidden_layers": 2, "vocab_size": 100, "state_size": 16}
    cfg = fmt.config_from_json({**good, "time_step_limit": [0.0, {"__float__": "Infinity"}]}, cls)
    assert (cfg.d_model, cfg.nheads, cfg.vocab_size, cfg.padded_vocab_size, cfg.dt_limit) == (64, 8, 100, 100,
                                                                                             (0.0, float("inf")))
    assert fmt.config_json(cfg)["num_heads"] == 8 and "time_step_limit" not in fmt.config_json(cfg)
    with pytest.raises(ValueError, match=r"config.json: hidden_act='gelu' is not supported \(need 'silu'\)"):
        fmt.config_from_json({**good, "hidden_act": "gelu"}, cls)
    with pytest.raises(ValueError, match="num_heads=6 does not fit the other fields, which give 8"):
        fmt.config_from_json({**good, "num_heads": 6}, cls)
