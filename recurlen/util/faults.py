"""Fault injection for the fault-injection tests: kill or signal the process, or fill the disk, at a named point.

Used by tests only; inactive unless the environment variable RECURLEN_FAULT is set, e.g.

  RECURLEN_FAULT="point=middle,file=last.ckpt,skip=1,action=kill"

  point   where in an atomic write: start (nothing written yet), middle (half of the temporary file
          written), rename (the temporary file complete, just before it replaces the target)
  file    only writes whose target name contains this text (default: every write)
  skip    let this many matching writes through first (default 0)
  action  kill (SIGKILL this process, as a node failure would), enospc (the disk is full) or signal (send
          `signal=` to this process and go on writing, as a scheduler's signal arriving then would; once)

to interrupt training or validation at a given optimizer step,

  RECURLEN_FAULT="point=train,step=7,moment=after_backward,action=signal,signal=SIGTERM"

  point   train (during the training step that makes optimizer step `step` + 1, i.e. while global_step is
          `step`) or validation (during the validation run after `step` optimizer steps)
  moment  train: batch_start (before the forward), after_backward (before the optimizer step), batch_end
          (after the update, before the step's checkpoint is written); validation: start, batch (after a
          batch's loss), end (after its metrics were logged); default the first
  signal  SIGTERM, SIGINT, SIGUSR1 (the signals a run turns into a checkpoint and a stop) or SIGKILL (kill -9)

and, to make training go non-finite at a given optimizer step,

  RECURLEN_FAULT="point=step,step=25,action=nan,what=grad"

  what    loss (the step's loss), grad (a gradient, before the optimizer step), state (the final state of
          layer 0) or weight (a weight, right after the optimizer step)

and, to stop a tokenize worker of data.tokenize=needed on a chunk of a build (the worker process reads it),

  RECURLEN_FAULT="point=tokenize,chunk=0,action=stall"

  chunk   the chunk's index in its build (0: the first chunk the build hands out; default 0)
  action  stall (the worker waits for ever without using the CPU, as a deadlocked process does) or kill

The trainer adds the callback that injects training faults (recurlen.training.fault_injection) only when one is
asked for; a run without it has no fault code in its steps.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from pathlib import Path

FAULT_ENV = "RECURLEN_FAULT"
WRITE_POINTS = ("start", "middle", "rename")
RUN_POINTS = ("train", "validation")
POINTS = (*WRITE_POINTS, "step", *RUN_POINTS, "tokenize")
ACTIONS = ("kill", "enospc", "nan", "signal", "stall")
NAN_TARGETS = ("loss", "grad", "state", "weight")
SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGKILL")
MOMENTS = {"train": ("batch_start", "after_backward", "batch_end"), "validation": ("start", "batch", "end")}

_seen = 0


def _spec() -> dict[str, str] | None:
    raw = os.environ.get(FAULT_ENV, "").strip()
    if not raw:
        return None
    spec = dict(item.split("=", 1) for item in raw.split(",") if "=" in item)
    point, action = spec.get("point"), spec.get("action")
    if point not in POINTS or action not in ACTIONS:
        raise ValueError(f"{FAULT_ENV}={raw!r}: point must be one of {list(POINTS)}, action one of {list(ACTIONS)}")
    if (point == "step") != (action == "nan") or (action == "nan" and spec.get("what") not in NAN_TARGETS):
        raise ValueError(f"{FAULT_ENV}={raw!r}: point=step goes with action=nan and what= one of {list(NAN_TARGETS)}")
    if (point == "tokenize" and action not in ("stall", "kill")) or (action == "stall" and point != "tokenize"):
        raise ValueError(f"{FAULT_ENV}={raw!r}: point=tokenize goes with action=stall or kill, action=stall with "
                         "point=tokenize")
    if point == "tokenize" and not spec.setdefault("chunk", "0").isdigit():
        raise ValueError(f"{FAULT_ENV}={raw!r}: point=tokenize takes chunk=N")
    if action == "signal" and spec.get("signal") not in SIGNALS:
        raise ValueError(f"{FAULT_ENV}={raw!r}: action=signal needs signal= one of {list(SIGNALS)}")
    if point in RUN_POINTS:
        if action not in ("kill", "signal") or not spec.get("step", "").isdigit():
            raise ValueError(f"{FAULT_ENV}={raw!r}: point={point} goes with action=kill or signal and step=N")
        if spec.setdefault("moment", MOMENTS[point][0]) not in MOMENTS[point]:
            raise ValueError(f"{FAULT_ENV}={raw!r}: moment= one of {list(MOMENTS[point])} for point={point}")
    return spec


def _signum(spec: dict[str, str]) -> int:
    return signal.SIGKILL if spec["action"] == "kill" else signal.Signals[spec["signal"]].value


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


def run_fault() -> tuple[str, int, str, int] | None:
    """(point, optimizer step, moment, signal number) when RECURLEN_FAULT asks this process to be signalled or
    killed during training or validation, else None. Read once, when the trainer is built."""
    spec = _spec()
    if spec is None or spec["point"] not in RUN_POINTS:
        return None
    if "rank" in spec and int(spec["rank"]) != int(os.environ.get("LOCAL_RANK", "0")):
        return None
    return spec["point"], int(spec["step"]), spec["moment"], _signum(spec)


def tokenize_fault(chunk: int) -> None:
    """Called by a tokenize worker before it tokenizes chunk `chunk` of a build; does nothing unless RECURLEN_FAULT
    asks for this chunk. stall: sleep for ever (no CPU used, no result), as a worker deadlocked on a lock does."""
    spec = _spec()
    if spec is None or spec["point"] != "tokenize" or int(spec["chunk"]) != chunk:
        return
    if spec["action"] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    while True:
        time.sleep(3600)


def at(point: str, target: Path, tmp: Path | None = None) -> None:
    """Called by recurlen.util.atomic_files at each point of an atomic write; does nothing unless a fault is armed."""
    global _seen
    spec = _spec()
    if spec is None or spec["point"] != point or spec.get("file", "") not in target.name:
        return
    _seen += 1
    if _seen <= int(spec.get("skip", 0)):
        return
    if spec["action"] == "signal":
        # Once: a second handled signal ends the process at once (recurlen.training.preemption), a different fault.
        if _seen == int(spec.get("skip", 0)) + 1:
            os.kill(os.getpid(), _signum(spec))
        return
    if point == "middle" and tmp is not None and tmp.is_file():
        # A write cut half-way: the temporary file holds only its first half.
        size = tmp.stat().st_size
        with open(tmp, "r+b") as f:
            f.truncate(size // 2)
    if spec["action"] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp or target))


__all__ = ["ACTIONS", "FAULT_ENV", "MOMENTS", "NAN_TARGETS", "POINTS", "RUN_POINTS", "SIGNALS", "WRITE_POINTS", "at",
           "nan_fault", "run_fault", "tokenize_fault"]
