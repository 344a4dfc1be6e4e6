"""Fault injection for the fault-injection tests: kill the process or fill the disk at a named point.

Used by tests only; inactive unless the environment variable RECURLEN_FAULT is set, e.g.

  RECURLEN_FAULT="point=middle,file=last.ckpt,skip=1,action=kill"

  point   where in an atomic write: start (nothing written yet), middle (half of the temporary file
          written), rename (the temporary file complete, just before it replaces the target)
  file    only writes whose target name contains this text (default: every write)
  skip    let this many matching writes through first (default 0)
  action  kill (SIGKILL this process, as a node failure would) or enospc (the disk is full)
"""

from __future__ import annotations

import errno
import os
import signal
from pathlib import Path

FAULT_ENV = "RECURLEN_FAULT"
POINTS = ("start", "middle", "rename")
ACTIONS = ("kill", "enospc")

_seen = 0


def _spec() -> dict[str, str] | None:
    raw = os.environ.get(FAULT_ENV, "").strip()
    if not raw:
        return None
    spec = dict(item.split("=", 1) for item in raw.split(",") if "=" in item)
    if spec.get("point") not in POINTS or spec.get("action") not in ACTIONS:
        raise ValueError(f"{FAULT_ENV}={raw!r}: point must be one of {list(POINTS)}, action one of {list(ACTIONS)}")
    return spec


def at(point: str, target: Path, tmp: Path | None = None) -> None:
    """Called by recurlen.files at each point of an atomic write; does nothing unless a fault is armed."""
    global _seen
    spec = _spec()
    if spec is None or spec["point"] != point or spec.get("file", "") not in target.name:
        return
    _seen += 1
    if _seen <= int(spec.get("skip", 0)):
        return
    if point == "middle" and tmp is not None and tmp.is_file():
        # A write cut half-way: the temporary file holds only its first half.
        size = tmp.stat().st_size
        with open(tmp, "r+b") as f:
            f.truncate(size // 2)
    if spec["action"] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp or target))


__all__ = ["ACTIONS", "FAULT_ENV", "POINTS", "at"]
