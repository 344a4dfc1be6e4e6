"""DataConfig: defaults, derived values, and ValueErrors that name the bad field and the allowed values."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from recurlen.training.data import DataConfig
from recurlen.training.data import config as config_mod


def test_defaults_and_derived_values(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cfg = DataConfig()
    assert (cfg.source, cfg.tokenizer, cfg.layout, cfg.val_mode) == ("embedded", "bytes", "contiguous", "first")
    assert cfg.long_val_length == 16 * 256 and DataConfig(seq_len=32, val_length=100).long_val_length == 100
    monkeypatch.setenv("RECURLEN_CACHE", str(tmp_path))
    assert DataConfig().cache_root == tmp_path
    assert DataConfig(cache_dir=str(tmp_path / "x")).cache_root == tmp_path / "x"
    monkeypatch.delenv("RECURLEN_CACHE")
    assert DataConfig().cache_root == Path("~/.cache/recurlen").expanduser()


def test_every_field_has_a_docstring() -> None:
    source = Path(config_mod.__file__).read_text()
    for f in fields(DataConfig):
        after = source.split(f"    {f.name}: ", 1)[1].split("\n", 2)[1]
        assert after.strip().startswith('"""'), f.name


@pytest.mark.parametrize(("overrides", "message"), [
    ({"layout": "strided"},
     r"layout='strided' is not supported; allowed: \['documents', 'contiguous', 'independent', 'packed'\]"),
    ({"val_mode": "all"}, r"val_mode='all' is not supported; allowed: \['first', 'pack', 'windows'\]"),
    ({"seq_len": 0}, r"seq_len=0 is not allowed; need an integer >= 1"),
    ({"batch_size": 2.5}, r"batch_size=2.5 is not allowed; need an integer >= 1"),
    ({"num_workers": -1}, r"num_workers=-1 is not allowed; need an integer >= 0"),
    ({"val_length": 0}, r"val_length=0 is not allowed; need an integer >= 1 or None"),
    ({"max_documents": 0}, r"max_documents=0 is not allowed; need an integer >= 1 or None"),
    ({"val_fraction": 1.0}, r"val_fraction=1.0 is out of range; allowed: 0 <= val_fraction < 1"),
    ({"source": ""}, r"source='' is empty; allowed: 'embedded', a path or glob, or 'hf:<name>'"),
    ({"source": "hf:"}, r"source='hf:' names no dataset"),
    ({"text_field": ""}, r"text_field is empty"),
])
def test_bad_values_raise_value_error_naming_them(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DataConfig(**overrides)
