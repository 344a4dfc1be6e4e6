"""A tokenize worker of data.tokenize=needed: a process of its own that reads chunks of rows on stdin and writes
their tokens on stdout (started by tokenize_pool.py: `python -m recurlen.training.data.tokenize_worker`).

A fresh interpreter, not a fork of the run: a forked child inherits its parent's signal handlers (the writer lock's,
the trainer's), the locks its threads held at the fork (torch's, the lock heartbeat's, tqdm's) and its open files
(the token cache being appended to); stopped with terminate(), such workers removed the run's writer lock, and a
pool whose worker was stopped while it held the result queue's lock hung for ever (docs/fault-cases.md).

It lives as long as its parent wants it: the signals a terminal or a scheduler sends to the whole process group
(SIGINT, SIGTERM, SIGHUP, SIGUSR1) are the parent's to act on; it ends when the parent closes its pipes (stdin at
its end, stdout broken) or dies (the same, and on Linux PR_SET_PDEATHSIG ends it at once, mid-chunk).

Frames, both ways: an 8-byte little-endian length, then the message: a 4-byte length, a JSON header, and in a reply
the arrays' raw bytes (never a pickle: nothing read from a pipe is executed). In: {"index", "texts", "bytes" (which
texts were bytes, sent as latin-1), "ids"}. Out: {"index", "rows", "dtype", "tokens"} and the tokens, each row's length
(int64) and id hash (uint64) back to back; or {"index", "error", "message", "traceback"} when tokenizing raised.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import struct
import sys
import traceback
from typing import Any

import numpy as np

from recurlen.training.data.corpus import TokenizeBatch
from recurlen.util import faults
from recurlen.util.tokenizers import load_tokenizer

HEADER = struct.Struct("<Q")
PARENT_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1")
_TOKENIZE: TokenizeBatch | None = None


def init(spec: str, dtype: str, *, process: bool = True) -> None:
    """Load the tokenizer (in each worker, or in the run's process when it tokenizes alone)."""
    global _TOKENIZE
    if process:  # one process per core: the Rust tokenizer's own thread pool would only compete with the others
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _TOKENIZE = TokenizeBatch(load_tokenizer(spec), text_field="text", id_field="id", dtype=np.dtype(dtype))


def tokenize_chunk(rows: list[tuple[Any, Any]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(tokens back to back, each row's length, each row's id hash, rows) of one chunk."""
    assert _TOKENIZE is not None, "worker not initialised"
    out = _TOKENIZE({"text": [r[0] for r in rows], "id": [r[1] for r in rows]})
    lengths = np.array([len(i) for i in out["ids"]], dtype=np.int64)
    flat = np.concatenate(out["ids"]) if len(rows) else np.zeros(0, _TOKENIZE.dtype)
    return flat, lengths, out["hash"], len(rows)


MESSAGE = struct.Struct("<I")
ERRORS = {e.__name__: e for e in (ValueError, TypeError, KeyError, UnicodeError, OverflowError, RuntimeError)}
"""Errors a worker's reply raises again in the run as themselves; any other is raised as a RuntimeError naming it."""


def frame(header: dict, *arrays: np.ndarray) -> bytes:
    """One frame: the JSON header, then the arrays' bytes (their sizes follow from the header)."""
    head = json.dumps(header).encode("utf-8", errors="surrogatepass")
    body = b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)
    data = MESSAGE.pack(len(head)) + head + body
    return HEADER.pack(len(data)) + data


def unframe(data: bytes) -> tuple[dict, bytes]:
    """(the header, the arrays' bytes) of a frame's payload."""
    size = MESSAGE.unpack_from(data)[0]
    start = MESSAGE.size
    return json.loads(data[start:start + size].decode("utf-8", errors="surrogatepass")), data[start + size:]


def task(index: int, rows: list[tuple[Any, Any]]) -> bytes:
    """The frame of one chunk of (text, id) rows. Ids go as their str() (or bytes), what document_hash reads."""
    texts = [r[0] for r in rows]
    return frame({"index": index, "bytes": [isinstance(t, bytes) for t in texts],
                  "texts": [t.decode("latin-1") if isinstance(t, bytes) else t for t in texts],
                  "ids": [{"b": k.decode("latin-1")} if isinstance(k, bytes) else str(k) for _, k in rows]})


def task_rows(header: dict) -> list[tuple[Any, Any]]:
    texts = [t.encode("latin-1") if was else t for t, was in zip(header["texts"], header["bytes"])]
    ids = [k["b"].encode("latin-1") if isinstance(k, dict) else k for k in header["ids"]]
    return list(zip(texts, ids))


def reply(index: int, flat: np.ndarray, lengths: np.ndarray, hashes: np.ndarray, count: int) -> bytes:
    return frame({"index": index, "rows": count, "dtype": flat.dtype.str, "tokens": int(flat.size)},
                 flat, lengths.astype(np.int64), hashes.astype(np.uint64))


def error_reply(index: int, err: BaseException, text: str) -> bytes:
    return frame({"index": index, "error": type(err).__name__, "message": str(err), "traceback": text})


def read_reply(header: dict, body: bytes) -> tuple:
    """(tokens, lengths, hashes, rows) of a reply, or (the error, its traceback in the worker)."""
    if "error" in header:
        cls = ERRORS.get(header["error"])
        err = cls(header["message"]) if cls else RuntimeError(f"{header['error']}: {header['message']}")
        return err, header["traceback"]
    dtype, n, rows = np.dtype(header["dtype"]), header["tokens"], header["rows"]
    flat = np.frombuffer(body, dtype=dtype, count=n)
    rest = body[n * dtype.itemsize:]
    lengths = np.frombuffer(rest, dtype=np.int64, count=rows)
    hashes = np.frombuffer(rest[rows * 8:], dtype=np.uint64, count=rows)
    return flat, lengths, hashes, rows


def _read_exact(fd: int, n: int) -> bytes | None:
    """n bytes from a blocking fd; None at its end (the parent closed it: between frames or inside one)."""
    parts, left = [], n
    while left:
        data = os.read(fd, min(left, 1 << 20))
        if not data:
            return None
        parts.append(data)
        left -= len(data)
    return b"".join(parts)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _die_with_parent(parent: int) -> None:
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):  # PR_SET_PDEATHSIG (1): SIGKILL when the parent ends
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:  # it ended before the line above took effect
        os._exit(0)


def main(argv: list[str]) -> int:
    spec, dtype, parent = argv[0], argv[1], int(argv[2])
    for name in PARENT_SIGNALS:
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    _die_with_parent(parent)
    out = os.dup(1)
    os.dup2(2, 1)  # whatever a library prints goes to the log, not into the frames
    init(spec, dtype)
    while True:
        header = _read_exact(0, HEADER.size)
        payload = None if header is None else _read_exact(0, HEADER.unpack(header)[0])
        if payload is None:
            return 0  # the parent wants no more
        header, _ = unframe(payload)
        index = header["index"]
        faults.tokenize_fault(index)
        try:
            answer = reply(index, *tokenize_chunk(task_rows(header)))
        except Exception as err:  # the parent raises it (a text field that is not text, or a bug)
            answer = error_reply(index, err, traceback.format_exc())
        try:
            _write_all(out, answer)
        except BrokenPipeError:
            return 0  # the parent stopped reading: it has what it wanted


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
