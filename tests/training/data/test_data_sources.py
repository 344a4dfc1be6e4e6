"""Corpus loading from local files and save_to_disk directories, the token cache, and bad-input errors."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from recurlen.training.data import Corpus, DataConfig, RecurlenDataModule, load_corpus
from recurlen.training.data import corpus as corpus_mod
from recurlen.util.tokenizers import ByteTokenizer


def make_texts(n: int = 24) -> list[str]:
    words = ["state", "lane", "token", "größe", "эпоха", "scan", "chunk", "\n"]
    return [f"doc {i}: " + " ".join(random.Random(i).choices(words, k=5 + 7 * i)) for i in range(n)]


def corpus_texts(dm: RecurlenDataModule) -> list[str]:
    corpus = dm.corpus
    assert isinstance(corpus, Corpus), "setup() loads the corpus"
    return [bytes(corpus.document(i).astype(np.uint8)).decode() for i in range(corpus.num_documents)]


def build(tmp_path: Path, source: Path | str, **overrides) -> RecurlenDataModule:
    cfg = dict(source=str(source), cache_dir=str(tmp_path / "cache"), seq_len=16, batch_size=2, val_fraction=0.2,
               val_segments=4, val_sequences=0)
    dm = RecurlenDataModule(DataConfig(**{**cfg, **overrides}))
    dm.setup()
    return dm


def write(tmp_path: Path, fmt: str, texts: list[str]) -> Path:
    import datasets

    rows = [{"text": t, "id": f"id-{i}", "n": i} for i, t in enumerate(texts)]
    if fmt == "jsonl":
        path = tmp_path / "docs.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "json":
        path = tmp_path / "docs.json"
        path.write_text(json.dumps(rows))
    elif fmt == "parquet":
        path = tmp_path / "docs.parquet"
        datasets.Dataset.from_list(rows).to_parquet(str(path))
    elif fmt == "text":
        path = tmp_path / "texts"
        path.mkdir()
        for i, t in enumerate(texts):
            (path / f"{i:03d}.txt").write_text(t)
    elif fmt == "save_to_disk":
        path = tmp_path / "saved"
        datasets.Dataset.from_list(rows).save_to_disk(str(path))
    else:
        raise AssertionError(fmt)
    return path


@pytest.mark.parametrize("fmt", ["jsonl", "json", "parquet", "text", "save_to_disk"])
def test_local_formats_load_every_document(tmp_path: Path, fmt: str) -> None:
    texts = make_texts()
    dm = build(tmp_path, write(tmp_path, fmt, texts))
    assert sorted(corpus_texts(dm)) == sorted(texts)
    assert dm.corpus.num_tokens == sum(len(t.encode()) for t in texts)
    train_ids, held_ids = dm.corpus.split(0.2)
    assert len(train_ids) + len(held_ids) == len(texts) and len(held_ids) > 0
    batch = dm.train_batch(0)
    assert batch["input_ids"].shape == (2, 16) and int(batch["input_ids"].max()) <= 256


def test_glob_max_documents_and_id_field_split(tmp_path: Path) -> None:
    texts = make_texts(30)
    for part in range(3):
        rows = [{"text": t, "id": f"id-{part * 10 + i}"} for i, t in enumerate(texts[part * 10:(part + 1) * 10])]
        (tmp_path / f"part{part}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    dm = build(tmp_path, tmp_path / "part*.jsonl", id_field="id", max_documents=25)
    assert corpus_texts(dm) == texts[:25]  # files in sorted order, rows in file order
    expected = np.array([corpus_mod.document_hash(f"id-{i}") for i in range(25)], dtype=np.uint64)
    np.testing.assert_array_equal(dm.corpus.doc_hash, expected)


def test_streaming_reads_the_same_documents(tmp_path: Path) -> None:
    texts = make_texts(20)
    path = write(tmp_path, "jsonl", texts)
    streamed = build(tmp_path, path, streaming=True, max_documents=12)
    assert corpus_texts(streamed) == texts[:12]
    whole = build(tmp_path, path, max_documents=12)
    assert streamed.corpus.path != whole.corpus.path  # different cache entries, same content
    np.testing.assert_array_equal(np.asarray(streamed.corpus.tokens), np.asarray(whole.corpus.tokens))


def test_num_proc_tokenizes_identically(tmp_path: Path) -> None:
    path = write(tmp_path, "jsonl", make_texts(40))
    one = load_corpus(DataConfig(source=str(path), cache_dir=str(tmp_path / "a")), ByteTokenizer())
    two = load_corpus(DataConfig(source=str(path), cache_dir=str(tmp_path / "b"), num_proc=2), ByteTokenizer())
    np.testing.assert_array_equal(np.asarray(one.tokens), np.asarray(two.tokens))
    np.testing.assert_array_equal(one.offsets, two.offsets)
    np.testing.assert_array_equal(one.doc_hash, two.doc_hash)


def test_non_utf8_text_file_does_not_crash(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_bytes(b"caf\xe9 latin-1 \xff\xfe bytes " * 20)
    (tmp_path / "docs" / "b.txt").write_text("plain text " * 20)
    dm = build(tmp_path, tmp_path / "docs", val_segments=0)
    texts = corpus_texts(dm)
    assert any("caf\ufffd latin-1" in t for t in texts) and dm.corpus.num_documents == 2


def test_cache_is_reused_and_invalidated(tmp_path: Path) -> None:
    path = write(tmp_path, "jsonl", make_texts())
    cfg = DataConfig(source=str(path), cache_dir=str(tmp_path / "cache"))
    first = load_corpus(cfg, ByteTokenizer())
    again = load_corpus(cfg, ByteTokenizer())
    assert first.path == again.path and again.meta["num_documents"] == 24
    path.write_text(path.read_text() + json.dumps({"text": "one more document"}) + "\n")
    changed = load_corpus(cfg, ByteTokenizer())
    assert changed.path != first.path and changed.num_documents == 25
    assert sorted(p.name.startswith("corpus-") for p in (tmp_path / "cache").iterdir() if p.is_dir()
                  and p.name != "hf-datasets") == [True, True]


def test_interrupted_build_leaves_no_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "jsonl", make_texts())
    cfg = DataConfig(source=str(path), cache_dir=str(tmp_path / "cache"))

    def interrupted(self, meta, *, what):  # the process dies after writing some tokens
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(corpus_mod._Writer, "finish", interrupted)
        with pytest.raises(KeyboardInterrupt):
            load_corpus(cfg, ByteTokenizer())
    leftovers = [p.name for p in (tmp_path / "cache").iterdir() if p.name != "hf-datasets"]
    assert leftovers == []
    assert load_corpus(cfg, ByteTokenizer()).num_documents == 24


def test_missing_sources_raise_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no_such\.jsonl'?: no such file or directory"):
        build(tmp_path, tmp_path / "no_such.jsonl")
    with pytest.raises(FileNotFoundError, match=r"no files match this glob"):
        build(tmp_path, tmp_path / "*.parquet")
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(FileNotFoundError, match=r"holds no saved dataset and no files"):
        build(tmp_path, tmp_path / "empty_dir")


def test_bad_sources_raise_value_errors(tmp_path: Path) -> None:
    path = write(tmp_path, "jsonl", make_texts())
    with pytest.raises(ValueError, match=r"text_field='body' is not a field .* its fields: \['text', 'id', 'n'\]"):
        build(tmp_path, path, text_field="body")
    with pytest.raises(ValueError, match=r"id_field='uid' is not a field"):
        build(tmp_path, path, id_field="uid")
    with pytest.raises(ValueError, match=r"text_field='n' holds int values, not text"):
        build(tmp_path, path, text_field="n")
    (tmp_path / "blank.jsonl").write_text(json.dumps({"text": ""}) + "\n" + json.dumps({"text": None}) + "\n")
    with pytest.raises(ValueError, match=r"is empty: none of its 2 rows has any text"):
        build(tmp_path, tmp_path / "blank.jsonl")
    (tmp_path / "notes.docx").write_text("x")
    with pytest.raises(ValueError, match=r"unknown suffix\); allowed suffixes"):
        build(tmp_path, tmp_path / "notes.docx")
    (tmp_path / "extra.txt").write_text("x")
    with pytest.raises(ValueError, match=r"mixes file formats \['json', 'text'\]"):
        build(tmp_path, tmp_path / "*.*[lt]")


def test_dataset_dict_split_and_streamed_field_errors(tmp_path: Path) -> None:
    import datasets

    rows = [{"text": t} for t in make_texts(10)]
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(rows), "test": datasets.Dataset.from_list(rows)})
    dd.save_to_disk(str(tmp_path / "dd"))
    assert build(tmp_path, tmp_path / "dd", split="test").corpus.num_documents == 10
    with pytest.raises(ValueError, match=r"DatasetDict without split='validation'; its splits: \['test', 'train'\]"):
        build(tmp_path, tmp_path / "dd", split="validation")
    path = write(tmp_path, "jsonl", make_texts())
    with pytest.raises(ValueError, match=r"text_field='body' is not a field .* its fields: \['text', 'id', 'n'\]"):
        build(tmp_path, path, text_field="body", streaming=True)


def write_word_tokenizer(path: Path, words: list[str]) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<|endoftext|>": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path))
    return path


def test_hf_tokenizer_and_vocab_check(tmp_path: Path) -> None:
    words = ["doc", "state", "lane", "token", "scan", "chunk"] + [f"w{i}" for i in range(500)]
    tok_path = write_word_tokenizer(tmp_path / "tokenizer.json", words)
    dm = build(tmp_path, write(tmp_path, "jsonl", make_texts()), tokenizer=str(tok_path), val_segments=0)
    assert dm.vocab_size == 508 and dm.eos_id == 0
    ids = dm.corpus.document(0).tolist()
    assert ids == dm.tokenizer.encode(make_texts()[0]) and ids[0] == 2  # "doc" -> 2
    dm.check_model_vocab(512)
    with pytest.raises(ValueError, match=r"has 508 ids but the model's vocabulary holds 257"):
        dm.check_model_vocab(257)


def test_hf_source_loads_a_local_dataset_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 'hf:' goes through datasets.load_dataset; a local directory of data files needs no hub access.
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    (tmp_path / "repo").mkdir()
    texts = make_texts(12)
    write(tmp_path / "repo", "jsonl", texts)
    dm = build(tmp_path, f"hf:{tmp_path / 'repo'}", val_segments=0)
    assert sorted(corpus_texts(dm)) == sorted(texts)
    with pytest.raises(ValueError, match=r"split='validation'\) could not be loaded"):
        build(tmp_path, f"hf:{tmp_path / 'repo'}", split="validation", val_segments=0)


def test_zero_byte_and_malformed_files(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text("")
    with pytest.raises(ValueError, match=r"is empty: its 1 file\(s\) hold no bytes"):
        build(tmp_path, tmp_path / "a.jsonl")
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "fine " * 50}) + "\n")
    assert build(tmp_path, tmp_path / "*.jsonl", val_segments=0).corpus.num_documents == 1  # a.jsonl is skipped
    (tmp_path / "bad.json").write_text('{"text": "unterminated')
    with pytest.raises(ValueError, match=r"datasets could not read these json files"):
        build(tmp_path, tmp_path / "bad.json")
