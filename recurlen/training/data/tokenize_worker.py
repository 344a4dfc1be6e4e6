"""A tokenize worker of data.tokenize=needed: a process of its own that reads chunks of rows on stdin and writes
their tokens on stdout (started by tokenize_pool.py: `python -m recurlen.training.data.tokenize_worker`).

A fresh interpreter, not a fork of the run: a forked child inherits its parent's signal handlers (the writer lock's,
the trainer's), the locks its threads held at the fork (torch's, the lock heartbeat's, tqdm's) and its open files
(the token cache being appended to); stopped with terminate(), such workers removed the run's writer lock, and a
pool whose worker was stopped while it held the result queue's lock hung for ever (docs/fault-cases.md).

It lives as long as its parent wants it: the signals a terminal or a scheduler sends to the whole process group
(SIGINT, SIGTERM, SIGHUP, SIGUSR1) are the parent's to act on; it ends when the parent closes its pipes (stdin at
its end, stdout broken) or dies (the same, and on Linux PR_SET_PDEATHSIG ends it at once, mid-chunk).

Frames, both ways: an 8-byte little-endian length, then a pickle. In: (chunk index, rows). Out: (chunk index,
tokens, lengths, hashes, rows), or (chunk index, the exception, its traceback) when tokenizing raised.
"""

from __future__ import annotations

import contextlib
import os
import pickle
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


def frame(obj: Any) -> bytes:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(data)) + data


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
        index, rows = pickle.loads(payload)
        faults.tokenize_fault(index)
        try:
            reply = frame((index, *tokenize_chunk(rows)))
        except Exception as err:  # the parent raises it (a text field that is not text, or a bug)
            text = traceback.format_exc()
            try:
                reply = frame((index, err, text))
            except Exception:  # an exception that does not pickle
                reply = frame((index, RuntimeError(f"{type(err).__name__}: {err}"), text))
        try:
            _write_all(out, reply)
        except BrokenPipeError:
            return 0  # the parent stopped reading: it has what it wanted


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
