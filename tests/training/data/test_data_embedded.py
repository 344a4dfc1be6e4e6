"""The embedded default corpus (the Python stdlib's .py files), built once per session into a tmp cache."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from recurlen.training.data import DataConfig, RecurlenDataModule, embedded
from recurlen.training.data.corpus import document_hash


@pytest.fixture(scope="session")
def embedded_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("recurlen-cache")


@pytest.fixture(scope="session")
def stdlib_dm(embedded_cache: Path) -> RecurlenDataModule:
    dm = RecurlenDataModule(DataConfig(cache_dir=str(embedded_cache), seq_len=64, batch_size=8))
    dm.setup()
    return dm


def walk_stdlib() -> list[Path]:
    """An independent listing of what the corpus should hold."""
    root = embedded.stdlib_root()
    found = []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = [d for d in subdirs if d not in {"test", "tests", "idlelib", "site-packages", "dist-packages"}]
        found += [Path(directory) / f for f in files if f.endswith(".py")]
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def test_embedded_corpus_holds_every_stdlib_source(stdlib_dm: RecurlenDataModule) -> None:
    files = walk_stdlib()
    nonempty = [f for f in files if f.stat().st_size > 0]
    corpus = stdlib_dm.corpus
    assert len(files) > 300  # ~674 on CPython 3.11
    assert corpus.num_documents == len(nonempty)
    assert corpus.num_tokens == sum(f.stat().st_size for f in files)
    assert bytes(corpus.document(0).astype(np.uint8)) == nonempty[0].read_bytes()
    rels = [rel for rel, _ in embedded.list_stdlib_sources()]
    assert not any(part in {"test", "tests", "idlelib", "site-packages"} for r in rels for part in r.split("/"))


def test_embedded_held_out_files_are_chosen_by_path_hash(stdlib_dm: RecurlenDataModule) -> None:
    root = embedded.stdlib_root()
    rels = [f.relative_to(root).as_posix() for f in walk_stdlib() if f.stat().st_size > 0]
    expected = {r for r in rels if document_hash(r) < int(0.05 * 2**64)}
    _, held = stdlib_dm.corpus.split(0.05)
    assert {rels[i] for i in held} == expected and 10 < len(expected) < 80


def test_embedded_cache_is_reused(stdlib_dm: RecurlenDataModule, embedded_cache: Path) -> None:
    again = RecurlenDataModule(DataConfig(cache_dir=str(embedded_cache), seq_len=64, batch_size=8))
    again.setup()
    assert again.corpus.path == stdlib_dm.corpus.path
    assert [p.name for p in embedded_cache.iterdir()] == [stdlib_dm.corpus.path.name]
    for step in (0, 3):
        assert all((again.train_batch(step)[k] == stdlib_dm.train_batch(step)[k]).all()
                   for k in ("input_ids", "targets"))


def test_embedded_long_validation_and_val_loader(stdlib_dm: RecurlenDataModule) -> None:
    long = stdlib_dm.long_validation_sequences()
    assert long.shape == (4, 16 * 64)
    _, held = stdlib_dm.corpus.split(0.05)
    firsts = [stdlib_dm.corpus.document(i)[:1024] for i in held if stdlib_dm.corpus.lengths[i] >= 1024][:4]
    np.testing.assert_array_equal(long.numpy(), np.stack(firsts))
    batches = list(stdlib_dm.val_dataloader())
    assert len(batches) == 8 and batches[0]["input_ids"].shape == (8, 64)


def test_fake_stdlib_excludes_dirs_and_keeps_raw_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "lib"
    for rel, data in {"a.py": b"x = 1\n" * 40, "pkg/b.py": b"# caf\xe9 \xff not utf-8\n" * 40,
                      "test/t.py": b"skip", "pkg/tests/t.py": b"skip", "idlelib/i.py": b"skip",
                      "site-packages/s.py": b"skip", "c.txt": b"not python"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    monkeypatch.setattr(embedded, "stdlib_root", lambda: root)
    assert [rel for rel, _ in embedded.list_stdlib_sources()] == ["a.py", "pkg/b.py"]
    dm = RecurlenDataModule(DataConfig(cache_dir=str(tmp_path / "c"), seq_len=8, batch_size=2, val_fraction=0.0,
                                       val_segments=0, val_sequences=0))
    dm.setup()
    assert bytes(dm.corpus.document(1).astype(np.uint8)) == b"# caf\xe9 \xff not utf-8\n" * 40
    assert dm.corpus.num_documents == 2 and dm.train_batch(0)["input_ids"].shape == (2, 8)


def test_embedded_max_documents_takes_the_first_files(tmp_path: Path) -> None:
    dm = RecurlenDataModule(DataConfig(cache_dir=str(tmp_path), max_documents=20, seq_len=16, batch_size=2,
                                       val_fraction=0.3, val_sequences=1, val_length=64))
    dm.setup()
    first = [p for p in walk_stdlib()[:20] if p.stat().st_size > 0]
    assert dm.corpus.num_documents == len(first)
    assert bytes(dm.corpus.document(len(first) - 1).astype(np.uint8)) == first[-1].read_bytes()


def test_sampler_pickles_without_the_token_array(stdlib_dm: RecurlenDataModule) -> None:
    # Spawned DataLoader workers receive the sampler by pickle: it must carry the cache path, not 11 MB of tokens.
    import pickle

    import torch

    stdlib_dm.train_batch(5)  # fills the epoch-stream cache that gets pickled too
    blob = pickle.dumps(stdlib_dm.sampler)
    assert len(blob) < 200_000 < stdlib_dm.corpus.num_tokens
    clone = pickle.loads(blob)
    assert torch.equal(clone.batch(5)["input_ids"], stdlib_dm.train_batch(5)["input_ids"])
