"""The token cache of tokenize='needed': the source's first documents, in file order, grown as far as runs read.

Layout, `<cache_root>/prefix-<key>/` (the key hashes the source's files and the tokenizer, as corpus-<key>/ does):
    tokens.bin    the documents' tokens back to back, appended to (uint16 / uint32)
    offsets.npy   (>= num_documents + 1,) int64; doc_hash.npy (>= num_documents,) uint64
    meta.json     num_documents, num_tokens, rows_read (source rows consumed, empty ones included), complete

meta.json is replaced last and says how much of the other files is valid, so an interrupted extension leaves the
cache as it was (a longer tokens.bin is cut back before the next append). Extensions hold a file lock: ranks and
runs sharing a cache never tokenize the same rows twice. Documents are tokenized by worker processes
(tokenize_pool.py), a chunk of rows each, and written in source order; a worker that stalls or ends stops the build
with one line, and what was appended before it is committed, so a rerun continues from there.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from recurlen.training.data import tokenize_worker
from recurlen.training.data.config import DataConfig
from recurlen.training.data.corpus import Corpus, corpus_key, dropped_rows, token_dtype, tokenizer_fingerprint
from recurlen.training.data.source_rows import Row, iter_rows
from recurlen.training.data.sources import Source, resolve_source, source_fingerprint
from recurlen.training.data.tokenize_pool import WorkerLost, WorkerPool
from recurlen.util.tokenizers import Tokenizer

log = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20
"""Text per worker task: small enough that the last chunk overshoots the target by little, large enough that
the pipes cost nothing next to tokenizing."""
CHUNK_ROWS = 256
COMMIT_SECONDS = 30.0
"""An extension is committed (meta.json) at least this often: an interrupted build keeps what it tokenized."""


def default_workers(cfg: DataConfig) -> int:
    """data.num_proc, at most the cores this process may use (more would only take turns; the parent only reads
    and appends)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(cfg.num_proc, cores) if cfg.num_proc else cores


def tokenize_needed(cfg: DataConfig, source: Source | None = None) -> bool:
    """Whether the run reads the source as far as it needs (tokenize='needed', or 'auto' on a large local source);
    ValueError when tokenize='needed' names a source these readers cannot stream."""
    from recurlen.training.data.config import NEEDED_ABOVE_BYTES
    from recurlen.training.data.source_rows import readable

    if cfg.tokenize == "all":
        return False
    source = source or resolve_source(cfg)
    if cfg.tokenize == "needed":
        if not readable(source):
            raise ValueError(f"tokenize='needed' reads local JSON-lines, parquet or .txt sources (plain, .gz, .bz2, "
                             f".xz, .zst); source={cfg.source!r} is not one; use tokenize=all")
        return True
    return (source.kind == "files" and sum(f.stat().st_size for f in source.files) > NEEDED_ABOVE_BYTES
            and readable(source))


def _chunks(rows: Iterator[Row]) -> Iterator[list[Row]]:
    chunk, size = [], 0
    for row in rows:
        chunk.append(row)
        size += len(row[0]) if isinstance(row[0], (str, bytes)) else 0
        if size >= CHUNK_BYTES or len(chunk) >= CHUNK_ROWS:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


class _Done:
    """A result already computed, with the `get()` of the pool's pending chunks."""

    def __init__(self, result) -> None:
        self.result = result

    def get(self):
        return self.result


class _Serial:
    """The pool's interface in this process (one worker: no processes to start)."""

    def __init__(self, spec: str, dtype: str) -> None:
        tokenize_worker.init(spec, dtype, process=False)

    def submit(self, chunk):
        return _Done(tokenize_worker.tokenize_chunk(chunk))

    def close(self) -> None:
        pass


def tokenize_in_order(rows: Iterator[Row], spec: str, dtype: np.dtype, *, workers: int,
                      ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, int]]:
    """(tokens, lengths, hashes, rows) of successive chunks of rows, tokenized by `workers` processes, in order.
    At most 2 chunks per worker are in flight, so a source is never read further ahead than that."""
    pool = _Serial(spec, dtype.name) if workers <= 1 else WorkerPool(workers, spec, dtype.name)
    pending: deque = deque()
    try:
        for chunk in _chunks(rows):
            pending.append(pool.submit(chunk))
            if len(pending) >= 2 * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()
    finally:
        pool.close()


# ----- the cache -----
class PrefixCache:
    """The cached prefix of one (source, tokenizer); `corpus()` reads it, `extend()` grows it."""

    def __init__(self, cfg: DataConfig, tokenizer: Tokenizer, source: Source | None = None) -> None:
        self.cfg, self.tokenizer = cfg, tokenizer
        self.source = source or resolve_source(cfg)
        self.key = corpus_key(cfg, tokenizer, self.source)
        self.path = cfg.cache_root / f"prefix-{self.key}"
        self.dtype = token_dtype(tokenizer.vocab_size)

    def meta(self) -> dict[str, Any]:
        try:
            return json.loads((self.path / "meta.json").read_text())
        except FileNotFoundError:
            return {"key": self.key, "num_documents": 0, "num_tokens": 0, "rows_read": 0, "complete": False,
                    "dtype": self.dtype.name, "source": source_fingerprint(self.source, self.cfg),
                    "tokenizer": tokenizer_fingerprint(self.tokenizer), "kind": "prefix"}

    def corpus(self) -> Corpus:
        meta = self.meta()
        if meta["num_documents"] == 0:
            empty = Corpus(np.zeros(0, self.dtype), np.zeros(1, np.int64), np.zeros(0, np.uint64), meta=meta)
            return empty
        return Corpus.load(self.path)

    def extend(self, missing: Callable[[Corpus], int], *, workers: int | None = None) -> Corpus:
        """Grow the cache until `missing(corpus)` (tokens still wanted, an estimate) is 0 or the source ends."""
        from filelock import FileLock

        self.path.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.path / ".lock")):
            corpus = self.corpus()
            want = missing(corpus)
            while want > 0 and not corpus.meta.get("complete"):
                self._append(corpus.num_tokens + want, workers=workers or default_workers(self.cfg))
                corpus = self.corpus()
                want = missing(corpus)
            return corpus

    def _append(self, target_tokens: int, *, workers: int) -> None:
        from tqdm import tqdm

        meta = self.meta()
        n_docs, n_tokens, rows_read = meta["num_documents"], meta["num_tokens"], meta["rows_read"]
        offsets = [np.load(self.path / "offsets.npy")[: n_docs + 1]] if n_docs else [np.zeros(1, np.int64)]
        hashes = [np.load(self.path / "doc_hash.npy")[:n_docs]] if n_docs else [np.zeros(0, np.uint64)]
        rows = iter_rows(self.source, self.cfg, skip=rows_read)
        if self.cfg.max_documents is not None:
            rows = (r for i, r in zip(range(self.cfg.max_documents - rows_read), rows))
        complete, last_commit = True, time.monotonic()
        first_row, first_empty, docs_before = rows_read, None, n_docs
        bar = tqdm(total=target_tokens, initial=n_tokens, unit="tok", unit_scale=True, desc="tokenizing",
                   dynamic_ncols=True, mininterval=1.0)
        with open(self.path / "tokens.bin", "ab") as out:
            out.truncate(n_tokens * self.dtype.itemsize)  # what an interrupted extension appended is not valid
            # closing: the workers end when this loop does (a break, an error), not when the generator is collected
            chunks = contextlib.closing(tokenize_in_order(rows, self.tokenizer.name, self.dtype, workers=workers))
            try:
                with chunks as tokenized:
                    for flat, lengths, doc_hash, n_rows in tokenized:
                        keep = lengths > 0  # rows without text are dropped, as in the whole-source cache
                        if first_empty is None and not keep.all():
                            first_empty = rows_read + int(np.argmin(keep))
                        np.ascontiguousarray(flat, dtype=self.dtype).tofile(out)
                        offsets.append(n_tokens + np.cumsum(lengths[keep]))
                        hashes.append(doc_hash[keep].astype(np.uint64))
                        n_docs, n_tokens, rows_read = n_docs + int(keep.sum()), n_tokens + len(flat), rows_read + n_rows
                        bar.update(len(flat))
                        if n_tokens >= target_tokens:
                            complete = False
                            break
                        if time.monotonic() - last_commit > COMMIT_SECONDS:
                            out.flush()
                            self._commit(meta, offsets, hashes, n_docs, n_tokens, rows_read, complete=False)
                            last_commit = time.monotonic()
            except WorkerLost as err:  # keep what the chunks before it gave: a rerun continues from there
                bar.close()
                out.flush()
                self._commit(meta, offsets, hashes, n_docs, n_tokens, rows_read, complete=False)
                raise WorkerLost(f"tokenizing {self.cfg.source} into the token cache {self.path}: {err}; the cache "
                                 f"keeps the {n_docs} documents tokenized before it and a rerun continues from there "
                                 "(data.num_proc=1 tokenizes in the run's own process)") from None
            out.flush()
            os.fsync(out.fileno())
        bar.close()
        self._commit(meta, offsets, hashes, n_docs, n_tokens, rows_read, complete=complete)
        if first_empty is not None:
            log.warning(dropped_rows(self.cfg, self.source, rows=rows_read - first_row, kept=n_docs - docs_before,
                                     first=first_empty))
        log.info("token cache %s: %d documents, %d tokens (%d source rows read)%s", self.path, n_docs, n_tokens,
                 rows_read, "; the source ends there" if complete else "")

    def _commit(self, meta: dict[str, Any], offsets: list[np.ndarray], hashes: list[np.ndarray], n_docs: int,
                n_tokens: int, rows_read: int, *, complete: bool) -> None:
        for name, parts in (("offsets.npy", offsets), ("doc_hash.npy", hashes)):
            tmp = self.path / f".{name}.tmp.npy"
            np.save(tmp, np.concatenate(parts))
            os.replace(tmp, self.path / name)
        meta = dict(meta, num_documents=n_docs, num_tokens=n_tokens, rows_read=rows_read, complete=complete,
                    skipped_empty=rows_read - n_docs)
        tmp = self.path / ".meta.json.tmp"
        tmp.write_text(json.dumps(meta, indent=1, sort_keys=True))
        os.replace(tmp, self.path / "meta.json")


def sample_rate(cfg: DataConfig, tokenizer: Tokenizer, source: Source, *, workers: int,
                max_bytes: int = 2 << 20) -> tuple[float, float]:
    """(tokens per second, tokens per document) of the cache's own pipeline (reading, `workers` processes started,
    writing aside) on the source's first `max_bytes` of text: what a build of that source will run at on this
    machine as loaded as it is now."""

    def first_rows() -> Iterator[Row]:
        size = 0
        for row in iter_rows(source, cfg):
            yield row
            size += len(row[0]) if isinstance(row[0], (str, bytes)) else 0
            if size >= max_bytes:
                return

    tokens = documents = 0
    begin = time.perf_counter()
    try:
        for flat, lengths, _, _ in tokenize_in_order(first_rows(), tokenizer.name, token_dtype(tokenizer.vocab_size),
                                                     workers=workers):
            tokens, documents = tokens + len(flat), documents + len(lengths)
    except WorkerLost as err:
        raise WorkerLost(f"tokenizing the first {max_bytes >> 20} MB of {cfg.source} to measure the rate: {err}; "
                         "rerun (data.num_proc=1 tokenizes in the run's own process)") from None
    seconds = time.perf_counter() - begin
    return tokens / max(seconds, 1e-9), tokens / max(documents, 1)


__all__ = ["PrefixCache", "default_workers", "sample_rate", "tokenize_in_order", "tokenize_needed"]
