"""Fault injection for the fault-injection tests: kill the process or fill the disk at a named point.

Used by tests only; inactive unless the environment variable RECURLEN_FAULT is set, e.g.

  RECURLEN_FAULT="point=middle,file=last.ckpt,skip=1,action=kill"

  point   where in an atomic write: start (nothing written yet), middle (half of the temporary file
          written), rename (the temporary file complete, just before it replaces the target)
  file    only writes whose target name contains this text (default: every write)
  skip    let this many matching writes through first (default 0)
  action  kill (SIGKILL this process, as a node failure would) or enospc (the disk is full)

and, to make training go non-finite at a given optimizer step,

  RECURLEN_FAULT="point=step,step=25,action=nan,what=grad"

  what    loss (the step's loss), grad (a gradient, before the optimizer step), state (the final state of
          layer 0) or weight (a weight, right after the optimizer step)

The trainer adds the callback that injects these (recurlen.training.fault_injection) only when one is asked
for; a run without it has no fault code in its steps.
"""

from __future__ import annotations

import errno
import os
import signal
from pathlib import Path

FAULT_ENV = "RECURLEN_FAULT"
POINTS = ("start", "middle", "rename", "step")
ACTIONS = ("kill", "enospc", "nan")
NAN_TARGETS = ("loss", "grad", "state", "weight")

_seen = 0


def _spec() -> dict[str, str] | None:
    raw = os.environ.get(FAULT_ENV, "").strip()
    if not raw:
        return None
    spec = dict(item.split("=", 1) for item in raw.split(",") if "=" in item)
    if spec.get("point") not in POINTS or spec.get("action") not in ACTIONS:
        raise ValueError(f"{FAULT_ENV}={raw!r}: point must be one of {list(POINTS)}, action one of {list(ACTIONS)}")
    if (spec["point"] == "step") != (spec["action"] == "nan") or (
            spec["action"] == "nan" and spec.get("what") not in NAN_TARGETS):
        raise ValueError(f"{FAULT_ENV}={raw!r}: point=step goes with action=nan and what= one of {list(NAN_TARGETS)}")
    return spec


def nan_fault() -> tuple[int, str] | None:
    """(optimizer step, what) when RECURLEN_FAULT asks this process to make `what` non-finite at that step, else
    None. Read once, when the trainer is built (it then adds the callback that injects it)."""
    spec = _spec()
    if spec is None or spec["action"] != "nan":
        return None
    # rank=N limits it to one DDP process (the launcher's children have LOCAL_RANK; the first process is rank 0).
    if "rank" in spec and int(spec["rank"]) != int(os.environ.get("LOCAL_RANK", "0")):
        return None
    return int(spec.get("step", -1)), spec["what"]


def at(point: str, target: Path, tmp: Path | None = None) -> None:
    """Called by recurlen.util.atomic_files at each point of an atomic write; does nothing unless a fault is armed."""
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


__all__ = ["ACTIONS", "FAULT_ENV", "NAN_TARGETS", "POINTS", "at", "nan_fault"]
