"""Writing a fixed model's weights (save_pretrained, `recurlen export`'s writers): an A scale is folded into A_log
exactly, a scale no weights file can hold (dt; A without A_log) is refused in one line instead of dropped."""

from __future__ import annotations

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
    model = nano_model(arch)
    ids = torch.randint(0, model.config.vocab_size, (2, 48), generator=torch.Generator().manual_seed(0))
    plain = _logits(model, ids)
    layers = len(timescales.mixers(model))
    timescales.set_scales(model, "A", torch.tensor([0.5, 4.0] * layers)[:layers])
    scaled = _logits(model, ids)
    assert (scaled - plain).abs().max() > 1e-3  # the scale changes the model
    model.save_pretrained(str(tmp_path / "m"))
    back = registry.get(arch).model_cls.from_pretrained(str(tmp_path / "m")).eval()
    torch.testing.assert_close(_logits(back, ids), scaled, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", [n for n, a in registry.architectures().items()
                                  if "A" in timescales.knobs(a.model_cls)
                                  and "A_log" not in timescales.knobs(a.model_cls) and "nano" in a.presets])
def test_an_a_scale_without_a_log_is_refused(arch, nano_model, tmp_path):
    model = nano_model(arch)
    timescales.set_scales(model, "A", torch.full((len(timescales.mixers(model)),), 2.0))
    with pytest.raises(UserError, match="A scaled per layer .*no A_log to fold it into"):
        model.save_pretrained(str(tmp_path / "m"))
