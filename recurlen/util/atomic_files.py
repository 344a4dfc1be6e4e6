"""Every file recurlen writes goes through here, atomically.

A write goes to a temporary sibling with a unique name (two writers of the same file never share a
temporary), is fsync'ed, then renamed over the target, and the directory entry is fsync'ed too: a
reader or a resumed run sees the old file or the new one, never half of one, even after a crash or a
power cut.
"""

from __future__ import annotations

import errno
import json
import math
import os
import socket
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from recurlen.util import faults
from recurlen.util.errors import UserError


def _fsync_path(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # some platforms cannot open a directory; the rename itself is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _free_bytes(directory: Path) -> int:
    import shutil

    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return 1 << 62


def _user_error(err: OSError, path: Path) -> UserError | None:
    """A full disk, a read-only file system or missing permissions: the user's to fix, said in one line."""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return UserError(f"no space left on device while writing {path} (nothing was replaced: the files written "
                         "before are intact); free space or choose another run_dir, then rerun: a run resumes from "
                         "its newest checkpoint")
    if err.errno == errno.EROFS:
        return UserError(f"cannot write {path}: read-only file system; choose a writable run_dir")
    if err.errno in (errno.EACCES, errno.EPERM):
        return UserError(f"cannot write {path}: permission denied; choose a writable run_dir or fix its permissions")
    return None


TEMPORARY_GLOB = ".*.tmp"
FOREIGN_STALE_AFTER_S = 6 * 3600.0
"""A temporary written from another machine (shared file system) counts as a leftover only after this long:
its writer's process cannot be looked up from here."""


def _host() -> str:
    return socket.gethostname().replace(".", "-") or "host"


def _temporary(path: Path) -> Path:
    # A name no other writer uses (machine + process id + random), hidden, in the same directory so the rename
    # is atomic; the machine and process let a later run tell a leftover from a write in progress.
    return path.with_name(f".{path.name}.{_host()}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def remove_stale_temporaries(directory: str | os.PathLike, *, now: float | None = None) -> list[Path]:
    """Delete the temporaries that interrupted writes left in `directory` (a checkpoint's can be gigabytes).

    Only atomic_write's own names whose writer is gone: written on this machine by a process that is no
    longer running, or on another machine and untouched for FOREIGN_STALE_AFTER_S. Returns what was deleted."""
    now = time.time() if now is None else now
    removed = []
    for tmp in sorted(Path(directory).glob(TEMPORARY_GLOB)):
        parts = tmp.name[1:-len(".tmp")].rsplit(".", 3)
        if len(parts) != 4 or not parts[2].isdigit() or len(parts[3]) != 8:
            continue  # not one of ours
        _, host, pid, _ = parts
        try:
            age = now - tmp.stat().st_mtime
        except FileNotFoundError:
            continue
        if (not _alive(int(pid))) if host == _host() else age > FOREIGN_STALE_AFTER_S:
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


def atomic_write(path: str | os.PathLike, write: Callable[[Path], object]) -> Path:
    """Call write(tmp) on a unique temporary sibling of path, fsync it and rename it onto path."""
    path = Path(path)
    tmp = _temporary(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        faults.at("start", path)
        write(tmp)
        faults.at("middle", path, tmp)
        _fsync_path(tmp)
        faults.at("rename", path, tmp)
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        user = _user_error(err, path)
        if user is None:
            raise
        raise user from err
    except RuntimeError as err:
        # torch.save reports a short write on a full disk as "unexpected pos N vs M", not as ENOSPC.
        full = "unexpected pos" in str(err) and _free_bytes(path.parent) < (1 << 20)
        tmp.unlink(missing_ok=True)
        if not full:
            raise
        raise _user_error(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), path) from err
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_path(path.parent)
    return path


def write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write(path, lambda p: p.write_text(text))


def json_safe(obj: Any) -> Any:
    """JSON has no NaN or infinity: they become null; tuples become lists, mapping keys strings."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    return obj


def write_json(path: str | os.PathLike, obj: Any, *, indent: int = 1) -> Path:
    """obj as JSON with non-finite numbers written as null (strict JSON every reader parses)."""
    return write_text(path, json.dumps(json_safe(obj), indent=indent, allow_nan=False))


def save_torch(obj: Any, path: str | os.PathLike) -> Path:
    import torch

    return atomic_write(path, lambda p: torch.save(obj, p))


def save_figure(fig, path: str | os.PathLike, *, dpi: int = 120, tight: bool = False) -> Path:
    """A matplotlib figure as PNG (`tight` crops the margins to the drawn content)."""
    extra = {"bbox_inches": "tight"} if tight else {}
    return atomic_write(path, lambda p: fig.savefig(p, format="png", dpi=dpi, **extra))


__all__ = ["atomic_write", "json_safe", "save_figure", "save_torch", "write_json", "write_text"]
