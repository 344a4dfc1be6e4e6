"""Rows without text in both tokenize modes: a row that lacks data.text_field is a document without text, as a null or
an empty one is. Both modes drop such rows, hold the same documents and log the same line (how many, and where the
first one is); a text_field that no row has is refused by both."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from recurlen.training.data import DataConfig, load_corpus
from recurlen.training.data.prefix_cache import PrefixCache
from recurlen.util.tokenizers import ByteTokenizer


@pytest.fixture
def source(tmp_path) -> Path:
    """40 rows after a blank line: every tenth has no "text" field, row 5 a null text, row 7 an empty one."""
    rows = [{"text": f"doc {i}: the state of lane {i}"} if i % 10 else {"title": f"no text {i}"} for i in range(40)]
    rows[5], rows[7] = {"text": None}, {"text": ""}
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n" + "".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def warnings():
    """The lines recurlen logs at WARNING (its loggers may not propagate to pytest's once a command set them up)."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler, logger = Keep(logging.WARNING), logging.getLogger("recurlen")
    logger.addHandler(handler)
    yield lines
    logger.removeHandler(handler)


def config(source: Path, cache: Path, tokenize: str, **overrides) -> DataConfig:
    return DataConfig(source=str(source), cache_dir=str(cache), tokenize=tokenize, **overrides)


@pytest.mark.parametrize("num_proc", [1, 2])
def test_both_modes_drop_rows_without_text_and_say_so_in_the_same_line(tmp_path, source, warnings, num_proc):
    whole = load_corpus(config(source, tmp_path / "all", "all"), ByteTokenizer())
    said_by_all = [w for w in warnings if "have no text" in w]
    needed = PrefixCache(config(source, tmp_path / "needed", "needed", num_proc=num_proc),
                         ByteTokenizer()).extend(lambda c: 1 << 40)
    said_by_needed = [w for w in warnings if "have no text" in w][len(said_by_all):]
    assert whole.num_documents == needed.num_documents == 34  # 40 rows less 4 without the field, a null, an empty
    assert np.array_equal(np.asarray(whole.tokens), np.asarray(needed.tokens))
    assert np.array_equal(whole.offsets, needed.offsets) and np.array_equal(whole.doc_hash, needed.doc_hash)
    assert whole.meta["skipped_empty"] == needed.meta["skipped_empty"] == 6
    line = (f"source={str(source)!r}: 6 of the 40 rows read have no text in text_field='text' (missing, null or "
            "empty): dropped, not documents; the first is at mixed.jsonl line 2")
    assert said_by_all == said_by_needed == [line]


def test_a_text_field_that_no_row_has_is_refused_by_both_modes(tmp_path, source):
    with pytest.raises(ValueError, match=r"text_field='body' is not a field of source=.*; its fields: \['title', "
                                         r"'text'\]"):
        load_corpus(config(source, tmp_path / "all", "all", text_field="body"), ByteTokenizer())
    with pytest.raises(ValueError, match=r"text_field='body' is not a field of source=.* \(mixed.jsonl line 2 and "
                                         r"the 39 rows after it\); its fields: \['title'\]"):
        PrefixCache(config(source, tmp_path / "needed", "needed", text_field="body", num_proc=1),
                    ByteTokenizer()).extend(lambda c: 1 << 40)


def test_needed_refuses_a_long_source_whose_first_rows_all_lack_the_field(tmp_path, monkeypatch):
    from recurlen.training.data import source_rows

    monkeypatch.setattr(source_rows, "FIELD_CHECK_ROWS", 5)  # 1000 in a run: its first batch, as datasets' check
    path = tmp_path / "long.jsonl"
    path.write_text("".join(json.dumps({"body": f"doc {i}"}) + "\n" for i in range(50)))
    with pytest.raises(ValueError, match=r"text_field='text' is not a field of source=.* \(long.jsonl line 1 and the 4 "
                                         r"rows after it\); its fields: \['body'\]"):
        PrefixCache(config(path, tmp_path / "needed", "needed", num_proc=1), ByteTokenizer()).extend(lambda c: 1)
