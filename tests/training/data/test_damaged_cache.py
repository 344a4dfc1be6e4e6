"""A damaged corpus cache is rebuilt, never read; the damaged one is kept aside."""

import json

import numpy as np
import pytest

from recurlen.training.data.config import DataConfig
from recurlen.training.data.corpus import cache_problem, load_corpus
from recurlen.util.errors import UserError
from recurlen.util.tokenizers import ByteTokenizer, load_tokenizer


@pytest.mark.parametrize("damage", ["flip", "truncate", "meta"])
def test_damaged_corpus_cache_is_rebuilt_not_read(tmp_path, caplog, damage):
    cfg = DataConfig(source="embedded", cache_dir=str(tmp_path), max_documents=30, seq_len=16)
    tok = ByteTokenizer()
    first = load_corpus(cfg, tok)
    want = np.array(first.tokens).copy()
    cache = first.path
    assert cache_problem(cache) is None
    tokens = cache / "tokens.bin"
    if damage == "flip":
        data = bytearray(tokens.read_bytes())
        data[len(data) // 2] ^= 0x01
        tokens.write_bytes(bytes(data))
    elif damage == "truncate":
        tokens.write_bytes(tokens.read_bytes()[:-10])
    else:
        (cache / "meta.json").write_text("{")
    assert cache_problem(cache) is not None
    with caplog.at_level("WARNING"):
        again = load_corpus(cfg, tok)
    assert "is damaged" in caplog.text and "rebuilding" in caplog.text
    assert np.array_equal(np.array(again.tokens), want)
    assert [p for p in tmp_path.iterdir() if ".damaged-" in p.name]  # kept aside, not deleted
    assert json.loads((again.path / "meta.json").read_text())["tokens_sha256"]


def test_malformed_tokenizer_json_is_one_clear_error(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text('{"version": "1.0", "model": ')
    with pytest.raises(UserError, match=r"tokenizer.json is not a valid tokenizer.json .*data.tokenizer=bytes"):
        load_tokenizer(str(path))
