"""The tokenized corpus: one flat token array, per-document offsets, and a cache that builds it once.

Cache layout, `<cache_root>/corpus-<key>/` (the key hashes the source's files and the tokenizer):
    tokens.bin    all documents' tokens back to back, no separators (uint16, or uint32 for large vocabularies)
    offsets.npy   (num_documents + 1,) int64: document i is tokens[offsets[i]:offsets[i + 1]]
    doc_hash.npy  (num_documents,) uint64 hash of each document's id; decides the held-out split
    meta.json     counts, dtype, tokenizer and source description

A build writes into a temporary directory that is renamed into place only when complete (os.replace is
atomic), so an interrupted build never leaves a cache that looks valid. EOS is not stored: readers
insert it between documents, which lets one cache serve any document order.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from recurlen.training.data import embedded
from recurlen.training.data.config import DataConfig
from recurlen.training.data.source_rows import row_place
from recurlen.training.data.sources import Source, check_columns, open_dataset, resolve_source, source_fingerprint
from recurlen.util.tokenizers import ByteTokenizer, Tokenizer

log = logging.getLogger(__name__)

CACHE_VERSION = 1
_U64 = 2**64


def document_hash(key: object) -> int:
    """A stable 64-bit hash of a document id (str, bytes, or anything with a str())."""
    data = key if isinstance(key, bytes) else str(key).encode("utf-8", errors="surrogatepass")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)


class Corpus:
    """Documents as a flat token array plus offsets; memory-mapped when loaded from the cache."""

    def __init__(self, tokens: np.ndarray, offsets: np.ndarray, doc_hash: np.ndarray, *,
                 path: Path | None = None, meta: dict[str, Any] | None = None) -> None:
        assert offsets.ndim == 1 and len(offsets) == len(doc_hash) + 1 and offsets[-1] == len(tokens)
        self.tokens, self.offsets, self.doc_hash = tokens, offsets.astype(np.int64), doc_hash.astype(np.uint64)
        self.path, self.meta = path, dict(meta or {})

    @property
    def num_documents(self) -> int:
        return len(self.doc_hash)

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def document(self, i: int) -> np.ndarray:
        return np.asarray(self.tokens[self.offsets[i]:self.offsets[i + 1]], dtype=np.int64)

    def split(self, val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
        """(training document ids ascending, held-out ids in hash order): a pure function of the ids."""
        threshold = min(int(val_fraction * _U64), _U64 - 1)
        heldout = self.doc_hash < np.uint64(threshold)
        held_ids = np.flatnonzero(heldout)
        held_ids = held_ids[np.argsort(self.doc_hash[held_ids], kind="stable")]
        return np.flatnonzero(~heldout), held_ids

    @classmethod
    def from_documents(cls, docs: Sequence[Sequence[int]], keys: Sequence[object] | None = None, *,
                       vocab_size: int = 2**16) -> Corpus:
        """An in-memory corpus, e.g. for tests; keys (default: the index) decide the held-out split."""
        keys = range(len(docs)) if keys is None else keys
        lengths = np.array([len(d) for d in docs], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        tokens = np.concatenate([np.asarray(d, dtype=np.int64) for d in docs]) if len(docs) else np.zeros(0)
        hashes = np.array([document_hash(k) for k in keys], dtype=np.uint64)
        return cls(tokens.astype(token_dtype(vocab_size)), offsets, hashes)

    @classmethod
    def load(cls, path: Path) -> Corpus:
        meta = json.loads((path / "meta.json").read_text())
        tokens = np.memmap(path / "tokens.bin", dtype=np.dtype(meta["dtype"]), mode="r", shape=(meta["num_tokens"],))
        # meta.json says how many documents are valid: a growing cache (prefix_cache.py) may hold more entries.
        n = int(meta["num_documents"])
        offsets, hashes = np.load(path / "offsets.npy")[: n + 1], np.load(path / "doc_hash.npy")[:n]
        return cls(tokens, offsets, hashes, path=path, meta=meta)

    # A cached corpus pickles as its path (DataLoader workers under spawn), not as gigabytes of tokens.
    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path} if self.path is not None else dict(self.__dict__)

    def __setstate__(self, state: dict[str, Any]) -> None:
        if set(state) == {"path"}:
            state = Corpus.load(state["path"]).__dict__
        self.__dict__.update(state)


class TokenizeBatch:
    """`Dataset.map(batched=True)` function: texts -> token arrays plus the hash of each document's id."""

    def __init__(self, tokenizer: Tokenizer, *, text_field: str, id_field: str | None, dtype: np.dtype) -> None:
        self.tokenizer, self.text_field, self.id_field, self.dtype = tokenizer, text_field, id_field, dtype

    def __call__(self, batch: dict[str, list[Any]]) -> dict[str, Any]:
        texts = batch[self.text_field]
        keys = batch[self.id_field] if self.id_field is not None else texts
        bad = next((t for t in texts if t is not None and not isinstance(t, (str, bytes))), None)
        if bad is not None:
            raise ValueError(f"text_field={self.text_field!r} holds {type(bad).__name__} values, not text")
        if isinstance(self.tokenizer, ByteTokenizer):
            # surrogateescape gives back the raw bytes of text decoded that way; bytes columns pass through.
            ids = [np.frombuffer(_as_bytes(t), dtype=np.uint8).astype(self.dtype) for t in texts]
        else:
            strs = [t.decode("utf-8", errors="replace") if isinstance(t, bytes) else (t or "") for t in texts]
            ids = [np.asarray(e, dtype=self.dtype) for e in self.tokenizer.encode_batch(strs)]
        return {"ids": ids, "hash": np.array([document_hash(k) for k in keys], dtype=np.uint64)}


def _as_bytes(text: str | bytes | None) -> bytes:
    if text is None:
        return b""
    return text if isinstance(text, bytes) else text.encode("utf-8", errors="surrogateescape")


class _Writer:
    """Appends documents to tokens.bin and remembers lengths and hashes; empty documents are dropped."""

    def __init__(self, directory: Path, dtype: np.dtype) -> None:
        self.directory, self.dtype = directory, dtype
        self._file = open(directory / "tokens.bin", "wb")  # noqa: SIM115 (closed in finish / on error)
        self._lengths: list[np.ndarray] = []
        self._hashes: list[np.ndarray] = []
        self.rows = self.documents = 0
        self.first_empty: int | None = None
        """The first row dropped for having no text."""

    def add_batch(self, flat: np.ndarray, lengths: np.ndarray, hashes: np.ndarray) -> None:
        np.ascontiguousarray(flat, dtype=self.dtype).tofile(self._file)
        keep = lengths > 0
        if self.first_empty is None and not keep.all():
            self.first_empty = self.rows + int(np.argmin(keep))
        self.documents += int(keep.sum())
        self._lengths.append(lengths[keep].astype(np.int64))
        self._hashes.append(hashes[keep].astype(np.uint64))
        self.rows += len(lengths)

    def add(self, docs: list[np.ndarray], hashes: np.ndarray) -> None:
        lengths = np.array([len(d) for d in docs], dtype=np.int64)
        flat = np.concatenate(docs) if docs else np.zeros(0, self.dtype)
        self.add_batch(flat, lengths, np.asarray(hashes, dtype=np.uint64))

    def finish(self, meta: dict[str, Any], *, what: str) -> None:
        self._file.close()
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, np.int64)
        if len(lengths) == 0:
            raise ValueError(f"{what} is empty: none of its {self.rows} rows has any text")
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        np.save(self.directory / "offsets.npy", offsets)
        np.save(self.directory / "doc_hash.npy", np.concatenate(self._hashes))
        meta = dict(meta, num_documents=len(lengths), num_tokens=int(offsets[-1]), dtype=self.dtype.name,
                    skipped_empty=int(self.rows - len(lengths)), tokens_sha256=_sha256(self.directory / "tokens.bin"))
        (self.directory / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True))

    def abort(self) -> None:
        self._file.close()


CHECKSUM_LIMIT = 4 << 30
"""tokens.bin up to this size is checksummed on every load; larger caches get the structural checks only."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def cache_problem(path: Path) -> str | None:
    """What is wrong with a finished cache directory (None: intact): sizes, offsets and the tokens' checksum."""
    try:
        meta = json.loads((path / "meta.json").read_text())
        n_tokens, n_docs = int(meta["num_tokens"]), int(meta["num_documents"])
        size = (path / "tokens.bin").stat().st_size
        if size != n_tokens * np.dtype(meta["dtype"]).itemsize:
            return f"tokens.bin holds {size} bytes, meta.json says {n_tokens} {meta['dtype']} tokens"
        offsets, hashes = np.load(path / "offsets.npy"), np.load(path / "doc_hash.npy")
        if (offsets.shape != (n_docs + 1,) or offsets[0] != 0 or offsets[-1] != n_tokens
                or (np.diff(offsets) < 0).any()):
            return "offsets.npy does not describe tokens.bin"
        if hashes.shape != (n_docs,):
            return f"doc_hash.npy has {hashes.shape[0]} entries for {n_docs} documents"
        want = meta.get("tokens_sha256")
        if want and size <= CHECKSUM_LIMIT and _sha256(path / "tokens.bin") != want:
            return "tokens.bin does not match its checksum"
    except (OSError, ValueError, KeyError, TypeError, IndexError) as err:
        return f"{type(err).__name__}: {err}"
    return None


def tokenizer_fingerprint(tokenizer: Tokenizer) -> dict[str, Any]:
    info: dict[str, Any] = {"class": type(tokenizer).__name__, "name": tokenizer.name,
                            "vocab_size": tokenizer.vocab_size, "eos_id": tokenizer.eos_id}
    path = Path(tokenizer.name).expanduser()
    for file in (path, path / "tokenizer.json"):
        if file.is_file():
            info["file"] = hashlib.sha256(file.read_bytes()).hexdigest()[:16]
    return info


def corpus_key(cfg: DataConfig, tokenizer: Tokenizer, source: Source | None = None) -> str:
    source = source or resolve_source(cfg)
    info = {"version": CACHE_VERSION, "source": source_fingerprint(source, cfg),
            "tokenizer": tokenizer_fingerprint(tokenizer)}
    return hashlib.sha256(json.dumps(info, sort_keys=True, default=str).encode()).hexdigest()[:16]


def load_corpus(cfg: DataConfig, tokenizer: Tokenizer) -> Corpus:
    """The cached corpus for (source, tokenizer), built first if it is not cached yet."""
    source = resolve_source(cfg)
    key = corpus_key(cfg, tokenizer, source)
    final = cfg.cache_root / f"corpus-{key}"
    if final.exists():
        problem = cache_problem(final)
        if problem is None:
            return Corpus.load(final)
        # A damaged cache is rebuilt, never read; the damaged one is kept aside for inspection.
        aside = final.with_name(f".{final.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
        try:
            os.replace(final, aside)
            log.warning("corpus cache %s is damaged (%s); moved it to %s and rebuilding it", final, problem, aside)
        except FileNotFoundError:
            pass  # another process moved it first
    cfg.cache_root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".corpus-{key}.", dir=cfg.cache_root))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the finished cache may be shared
    try:
        _build(cfg, tokenizer, source, key, tmp)
        try:
            os.replace(tmp, final)
        except OSError:
            if cache_problem(final) is not None:
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # another process finished the same build first
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    corpus = Corpus.load(final)
    log.info("built corpus cache %s: %d documents, %d tokens", final, corpus.num_documents, corpus.num_tokens)
    return corpus


def _build(cfg: DataConfig, tokenizer: Tokenizer, source: Source, key: str, tmp: Path) -> None:
    dtype = token_dtype(tokenizer.vocab_size)
    writer = _Writer(tmp, dtype)
    meta = {"key": key, "version": CACHE_VERSION, "source": source_fingerprint(source, cfg),
            "tokenizer": tokenizer_fingerprint(tokenizer)}
    try:
        if source.kind == "embedded":
            _write_embedded(cfg, tokenizer, writer)
        else:
            _write_dataset(cfg, tokenizer, source, key, tmp, writer)
    except BaseException:
        writer.abort()
        raise
    writer.finish(meta, what=f"source={cfg.source!r}")
    shutil.rmtree(tmp / "tokenized", ignore_errors=True)  # the Arrow map output, now flattened into tokens.bin
    if writer.first_empty is not None and source.kind != "embedded":
        log.warning(dropped_rows(cfg, source, rows=writer.rows, kept=writer.documents, first=writer.first_empty))


def dropped_rows(cfg: DataConfig, source: Source, *, rows: int, kept: int, first: int) -> str:
    """The line both tokenize modes log when rows had no text: a row without text_field is one, as a null or an
    empty one is (datasets reads a missing field as null, so tokenize='all' cannot tell them apart), and each mode
    drops it, so that both caches hold the same documents."""
    return (f"source={cfg.source!r}: {rows - kept} of the {rows} rows read have no text in text_field="
            f"{cfg.text_field!r} (missing, null or empty): dropped, not documents; the first is at "
            f"{row_place(source, cfg, first)}")


def _write_embedded(cfg: DataConfig, tokenizer: Tokenizer, writer: _Writer) -> None:
    files = embedded.list_stdlib_sources(max_documents=cfg.max_documents)
    docs, hashes = [], []
    for rel, data in embedded.iter_stdlib_documents(files):
        if isinstance(tokenizer, ByteTokenizer):
            docs.append(np.frombuffer(data, dtype=np.uint8).astype(writer.dtype))
        else:
            docs.append(np.asarray(tokenizer.encode(data.decode("utf-8", errors="replace")), dtype=writer.dtype))
        hashes.append(document_hash(rel))  # by path: the held-out files are the same on every machine
    writer.add(docs, np.array(hashes, dtype=np.uint64))


def _write_dataset(cfg: DataConfig, tokenizer: Tokenizer, source: Source, key: str, tmp: Path,
                   writer: _Writer) -> None:
    import datasets
    import pyarrow.compute as pc

    ds = open_dataset(source, cfg)
    fn = TokenizeBatch(tokenizer, text_field=cfg.text_field, id_field=cfg.id_field, dtype=writer.dtype)
    if isinstance(ds, datasets.IterableDataset):
        # Streamed: one pass, tokenized here (IterableDataset.map has no num_proc), written as it arrives.
        for i, batch in enumerate(ds.iter(batch_size=1000)):
            if i == 0:
                check_columns(list(batch), cfg)
            out = fn(batch)
            writer.add(out["ids"], out["hash"])
        return
    features = datasets.Features({"ids": datasets.List(datasets.Value(writer.dtype.name)),
                                  "hash": datasets.Value("uint64")})
    num_proc = min(cfg.num_proc, len(ds)) if cfg.num_proc and cfg.num_proc > 1 else None
    tokenized = ds.map(fn, batched=True, num_proc=num_proc, remove_columns=ds.column_names, features=features,
                       cache_file_name=str(tmp / "tokenized" / "tokens.arrow"), new_fingerprint=key,
                       desc="tokenizing")
    for table in tokenized.with_format("arrow").iter(batch_size=10_000):
        ids = table.column("ids").combine_chunks()
        lengths = pc.list_value_length(ids).to_numpy(zero_copy_only=False).astype(np.int64)
        writer.add_batch(ids.flatten().to_numpy(zero_copy_only=False), lengths,
                         table.column("hash").to_numpy().astype(np.uint64))


__all__ = ["CACHE_VERSION", "Corpus", "TokenizeBatch", "corpus_key", "document_hash", "dropped_rows", "load_corpus",
           "token_dtype"]
