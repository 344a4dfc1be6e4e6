"""Every file recurlen writes goes through here, atomically.

A write goes to a temporary sibling with a unique name (two writers of the same file never share a
temporary), is fsync'ed, then renamed over the target, and the directory entry is fsync'ed too: a
reader or a resumed run sees the old file or the new one, never half of one, even after a crash or a
power cut.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import json
import math
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
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


@dataclass(frozen=True)
class WriteAdvice:
    """What a failed write tells the user: the setting that chooses where the files go, what the failure left, and
    what to do after the fix. A run's by default; a command that writes elsewhere (`recurlen export`) sets its own
    around its writes (`advice`)."""

    place: str = "run_dir"
    kept: str = "nothing was replaced: the files written before are intact"
    then: str = "rerun: a run resumes from its furthest-trained intact checkpoint"


RUN_ADVICE = WriteAdvice()
_ADVICE: contextvars.ContextVar[WriteAdvice] = contextvars.ContextVar("write_advice", default=RUN_ADVICE)


@contextlib.contextmanager
def advice(given: WriteAdvice) -> Iterator[None]:
    """The advice of the write errors raised inside (write_error)."""
    token = _ADVICE.set(given)
    try:
        yield
    finally:
        _ADVICE.reset(token)


def write_error(err: OSError, path: Path) -> UserError | None:
    """A full disk, a read-only file system, missing permissions, a file where a directory belongs or the file-size
    limit: the user's to fix, said in one line (with the advice in force, WriteAdvice)."""
    a = _ADVICE.get()
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return UserError(f"no space left on device while writing {path} ({a.kept}); free space or choose another "
                         f"{a.place}, then {a.then}")
    if err.errno == errno.EROFS:
        return UserError(f"cannot write {path}: read-only file system; choose a writable {a.place}")
    if err.errno in (errno.EACCES, errno.EPERM):
        return UserError(f"cannot write {path}: permission denied; choose a writable {a.place} or fix its permissions")
    if err.errno in (errno.ENOTDIR, errno.EEXIST):
        blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), path.parent)
        return UserError(f"cannot write {path}: {blocker} is a file, not a directory; choose another {a.place}")
    if err.errno == errno.EFBIG:
        return UserError(f"cannot write {path}: it would exceed the file-size limit ({_size_limit_text()}; {a.kept}); "
                         f"raise it (ulimit -f unlimited), then {a.then}")
    return None


def file_size_limit() -> int | None:
    """The largest file this process may write (`ulimit -f`), in bytes; None when unlimited."""
    try:
        import resource
    except ImportError:  # not on this platform
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    return None if soft == resource.RLIM_INFINITY else soft


def _size_limit_text() -> str:
    limit = file_size_limit()
    return "ulimit -f" if limit is None else f"ulimit -f {limit // 1024}, i.e. {limit / 1e6:.3g} MB"


def check_file_size_limit(nbytes: int, what: str) -> None:
    """A UserError now when `what` (about `nbytes` bytes) could not be written under the file-size limit: said
    before a run writes anything, not as a failed write hours later."""
    limit = file_size_limit()
    if limit is not None and nbytes > limit:
        raise UserError(f"{what} takes about {nbytes / 1e6:.3g} MB, more than the file-size limit ({_size_limit_text()}"
                        "); raise it (ulimit -f unlimited) and rerun")


def _discard(tmp: Path) -> None:
    """Remove a failed write's temporary; where that fails too (read-only, a file in the path) the first error is
    the one to report."""
    with contextlib.suppress(OSError):
        tmp.unlink(missing_ok=True)


TEMPORARY_GLOB = ".*.tmp"
FOREIGN_STALE_AFTER_S = 6 * 3600.0
"""A temporary written from another machine (shared file system) counts as a leftover only after this long:
its writer's process cannot be looked up from here."""


def host_name() -> str:
    """This machine's name as temporaries and the run lock record it (dots become dashes: a name part)."""
    return socket.gethostname().replace(".", "-") or "host"


def _temporary(path: Path) -> Path:
    # A name no other writer uses (machine + process id + random), hidden, in the same directory so the rename
    # is atomic; the machine and process let a later run tell a leftover from a write in progress.
    return path.with_name(f".{path.name}.{host_name()}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


def pid_alive(pid: int) -> bool:
    """Whether a process with this id runs on this machine (someone else's counts)."""
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
        if (not pid_alive(int(pid))) if host == host_name() else age > FOREIGN_STALE_AFTER_S:
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
        _discard(tmp)
        user = write_error(err, path)
        if user is None:
            raise
        raise user from err
    except RuntimeError as err:
        # torch.save reports a short write (a full disk, the file-size limit) as "unexpected pos N vs M", not as
        # the OSError behind it.
        _discard(tmp)
        if "unexpected pos" not in str(err):
            raise
        if _free_bytes(path.parent) < (1 << 20):
            raise write_error(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), path) from err
        if file_size_limit() is not None:
            raise write_error(OSError(errno.EFBIG, os.strerror(errno.EFBIG)), path) from err
        raise UserError(f"writing {path} stopped short ({err}; {_ADVICE.get().kept}); check the file system's space, "
                        "quota and health, then rerun") from err
    except BaseException:
        _discard(tmp)
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


__all__ = ["RUN_ADVICE", "WriteAdvice", "advice", "atomic_write", "check_file_size_limit", "file_size_limit",
           "host_name", "json_safe", "pid_alive", "save_figure", "save_torch", "write_json", "write_text"]
