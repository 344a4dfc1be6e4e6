"""The embedded default corpus: the Python standard library's own .py sources.

Every machine that runs recurlen has them (~674 files, ~11 MB on CPython 3.11), so the main job and the
tests need no download. Files are read as bytes: a few stdlib files are not valid UTF-8 on purpose.
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

# Test suites are huge and repetitive, idlelib is an application, site-packages is not the stdlib.
EXCLUDED_DIRS = frozenset({"test", "tests", "idlelib", "site-packages", "dist-packages", "__pycache__"})


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def list_stdlib_sources(root: Path | None = None, *, max_documents: int | None = None) -> list[tuple[str, Path]]:
    """(relative posix path, absolute path) of every stdlib .py file, sorted by relative path."""
    root = root or stdlib_root()
    if not root.is_dir():
        raise FileNotFoundError(f"the Python standard library directory {root} does not exist")
    found = []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = [d for d in subdirs if d not in EXCLUDED_DIRS]
        for name in files:
            if name.endswith(".py"):
                path = Path(directory) / name
                found.append((path.relative_to(root).as_posix(), path))
    found.sort()
    if not found:
        raise ValueError(f"no .py files under the standard library directory {root}")
    return found[:max_documents] if max_documents is not None else found


def sources_fingerprint(files: list[tuple[str, Path]]) -> str:
    """Changes when any file is added, removed or modified, so a stale cache is never reused."""
    digest = hashlib.sha256(sys.version.encode())
    for rel, path in files:
        stat = path.stat()
        digest.update(f"{rel}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def iter_stdlib_documents(files: list[tuple[str, Path]]) -> Iterator[tuple[str, bytes]]:
    """(document id, raw bytes); the id is the relative path, which decides the held-out split."""
    for rel, path in files:
        yield rel, path.read_bytes()


__all__ = ["EXCLUDED_DIRS", "iter_stdlib_documents", "list_stdlib_sources", "sources_fingerprint", "stdlib_root"]
