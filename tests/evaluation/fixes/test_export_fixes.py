"""Writing a fixed model's weights (save_pretrained, `recurlen export`'s writers): an A scale is folded into A_log
exactly, a scale no weights file can hold (dt; A without A_log) is refused in one line instead of dropped."""

from __future__ import annotations

import copy

import pytest
import torch

from recurlen.models import registry, timescales, transformers_format
from recurlen.util.errors import UserError


def _logits(model, ids):
    with torch.no_grad():
        return model(ids)[0]


@pytest.mark.parametrize("arch", [n for n, a in registry.architectures().items()
                                  if "dt" in timescales.knobs(a.model_cls) and "nano" in a.presets])
def test_a_dt_scale_is_refused_by_every_writer_instead_of_dropped(arch, nano_model, tmp_path):
    model = nano_model(arch)
    layers = len(timescales.mixers(model))
    timescales.set_scales(model, "dt", torch.full((layers,), 0.125))
    with pytest.raises(UserError) as err:
        model.save_pretrained(str(tmp_path / "official"))
    line = str(err.value)
    assert "\n" not in line and "dt scaled per layer (0.125" in line and "no weights file can hold" in line
    assert "fixes=[mambaextend]" in line and not (tmp_path / "official").exists()
    fmt = registry.get(arch).transformers_format
    if fmt is not None:
        with pytest.raises(UserError, match="dt scaled per layer"):
            transformers_format.save(model, tmp_path / "hf", fmt)
    timescales.set_scales(model, "dt", torch.ones(layers))  # a scale of 1 is the model as trained: written
    model.save_pretrained(str(tmp_path / "ones"))
    assert (tmp_path / "ones").is_dir()


@pytest.mark.parametrize("arch", [n for n, a in registry.architectures().items()
                                  if {"A", "A_log"} <= set(timescales.knobs(a.model_cls)) and "nano" in a.presets])
def test_an_a_scale_is_folded_into_a_log_when_written(arch, nano_model, tmp_path):
    """Compared in float64: the fold is exact up to log s's float32 rounding, while the float32 scans' own rounding
    differs between two ways of writing the same decay (RWKV-6's chunked scan is ~1e-5 from float64 at the nano
    model's decays scaled by 4)."""
    model = nano_model(arch)
    ids = torch.randint(0, model.config.vocab_size, (2, 48), generator=torch.Generator().manual_seed(0))
    plain = _logits(model, ids)
    layers = len(timescales.mixers(model))
    timescales.set_scales(model, "A", torch.tensor([0.5, 4.0] * layers)[:layers])
    assert (_logits(model, ids) - plain).abs().max() > 1e-3  # the scale changes the model
    scaled = _logits(copy.deepcopy(model).double(), ids)
    model.save_pretrained(str(tmp_path / "m"))
    back = registry.get(arch).model_cls.from_pretrained(str(tmp_path / "m")).eval().double()
    torch.testing.assert_close(_logits(back, ids), scaled, atol=1e-6, rtol=0)


@pytest.mark.parametrize("arch", [n for n, a in registry.architectures().items()
                                  if "A" in timescales.knobs(a.model_cls)
                                  and "A_log" not in timescales.knobs(a.model_cls) and "nano" in a.presets])
def test_an_a_scale_without_a_log_is_refused(arch, nano_model, tmp_path):
    model = nano_model(arch)
    timescales.set_scales(model, "A", torch.full((len(timescales.mixers(model)),), 2.0))
    with pytest.raises(UserError, match="A scaled per layer .*no A_log to fold it into") as err:
        model.save_pretrained(str(tmp_path / "m"))
    assert "\n" not in str(err.value) and not (tmp_path / "m").exists()


@pytest.mark.parametrize("arch", [n for n, a in registry.architectures().items()
                                  if a.model_cls.weights_file is not None and a.model_cls.weights_file.write is not None
                                  and "A" in timescales.knobs(a.model_cls) and "nano" in a.presets])
def test_a_release_weights_file_folds_or_refuses_an_a_scale(arch, nano_model, tmp_path):
    """An architecture's own release file (RWKV's BlinkDL .pth) is written through the same rule as the official
    format: the scale folded into the log rate where there is one, refused in one line where there is none."""
    model = nano_model(arch)
    ids = torch.randint(0, model.config.vocab_size, (2, 48), generator=torch.Generator().manual_seed(0))
    fmt = model.weights_file
    timescales.set_scales(model, "A", torch.tensor([0.5, 4.0]))
    scaled = _logits(copy.deepcopy(model).double(), ids)
    path = tmp_path / f"m{fmt.suffix}"
    if "A_log" not in timescales.knobs(model):
        with pytest.raises(UserError, match="A scaled per layer .*no A_log to fold it into") as err:
            fmt.save(model, path)
        assert "\n" not in str(err.value) and not path.exists()
        return
    fmt.save(model, path)
    back = nano_model(arch)  # the file's weights in the model's own config (the file's has BlinkDL's norm eps)
    back.load_state_dict(registry.get(arch).model_cls.from_pretrained(str(path)).state_dict())
    torch.testing.assert_close(_logits(back.double(), ids), scaled, atol=1e-6, rtol=0)
