"""A source file read through the decompressor its name asks for, and the one line for a file that does not decompress.

A damaged .jsonl.zst, or a plain text file named .jsonl.zst, makes zstandard raise ZstdError from inside whichever
reader met it first (`datasets` for tokenize='all', recurlen.training.data.source_rows for 'needed'), which names no
file; gzip, bz2 and xz fail the same way with their own errors. Both paths turn them into `damaged(...)`, which names
the file and what its name promised.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import io
import lzma
import zlib
from collections.abc import Iterator
from pathlib import Path

KINDS = {".gz": "gzip", ".bz2": "bzip2", ".xz": "xz", ".zst": "zstd"}
"""Suffixes decompressed here (lz4 needs a package `datasets` may have; its files stay `datasets`' business)."""


def kind(path: Path) -> str | None:
    """'zstd', 'gzip', ... for a file whose name asks for decompression, else None."""
    return KINDS.get(path.suffix.lower())


def open_file(path: Path) -> io.BufferedIOBase:
    """The file's bytes, decompressed when its name says so (a plain binary file otherwise)."""
    what = kind(path)
    if what == "zstd":
        import zstandard

        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(open(path, "rb")))  # noqa: SIM115
    opener = {"gzip": gzip.open, "bzip2": bz2.open, "xz": lzma.open}.get(what or "", open)
    return opener(path, "rb")


def _decompression_failure(err: BaseException) -> bool:
    """Whether `err` is a decompressor's complaint about the data (bz2 and gzip raise OSErrors without an errno;
    an OSError with one, such as a permission denied, is about the file system and passes on)."""
    import zstandard

    if isinstance(err, OSError):
        return err.errno is None
    return isinstance(err, zstandard.ZstdError | lzma.LZMAError | zlib.error | EOFError)


def damaged(source: str, path: Path, err: BaseException) -> ValueError:
    """The one line for `path` of source=`source` that did not decompress."""
    what = kind(path)
    reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return ValueError(f"source={source!r}: {path} does not decompress as {what} ({reason}): the file is damaged, or "
                      f"its name ends in {path.suffix} but it is not {what}-compressed; fix, recompress or remove it")


@contextlib.contextmanager
def reading(source: str, path: Path) -> Iterator[None]:
    """A decompressor's error while `path` is read inside becomes damaged(...), which names the file."""
    try:
        yield
    except Exception as err:
        if kind(path) is None or not _decompression_failure(err):
            raise
        raise damaged(source, path, err) from err


def find_damaged(source: str, files: list[Path] | tuple[Path, ...]) -> ValueError | None:
    """damaged(...) for the first compressed file that does not decompress to its end (None: every one does).

    For a reader that failed without naming the file: each file is decompressed through."""
    for path in files:
        if kind(path) is None:
            continue
        try:
            with reading(source, path), open_file(path) as f:
                while f.read(1 << 20):
                    pass
        except ValueError as err:
            return err
    return None


__all__ = ["KINDS", "damaged", "find_damaged", "kind", "open_file", "reading"]
