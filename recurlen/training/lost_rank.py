"""A lost rank: when one process of a multi-process run dies (kill -9, an OOM kill, a lost node), say so in one line.

The ranks of a DDP / FSDP run meet in a collective at every step (the gradient all-reduce, the pre-emption flag,
metric syncs). When a peer process is gone its sockets are closed, so the survivors' next collective fails at
once: gloo raises a RuntimeError ("Connection reset by peer", "Connection closed by peer"), NCCL a DistBackendError;
a peer that hangs without closing its sockets (a frozen node) is only noticed when the process group's timeout
runs out (30 min, torch's default, left as it is: rank 0 alone may spend many minutes preparing the data or writing
a large checkpoint while the others wait in a barrier, and a shorter limit would stop such healthy runs).

Lightning lets that RuntimeError through as a 58-line traceback, and on the launching process its child watcher
SIGKILLs the survivor itself within 5 s, so the line may never come. `RankWatch` records every rank's host and pid
when fit begins and keeps the child watcher from killing this process (it still ends the other launched ranks);
when a collective fails because a peer is gone it names that rank (and how it ended, when this process launched
it), ends the launcher's other children (they cannot go on either), and `LostRank` becomes the command's one line
with the command that resumes the run (resuming is exact: the run continues from its newest checkpoint as if
nothing had happened).
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback

from recurlen.util.atomic_files import pid_alive
from recurlen.util.errors import UserError

log = logging.getLogger(__name__)

PEER_LOSS_MARKERS = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "Socket closed",
                     "NCCL communicator was aborted", "Timed out waiting", "timed out after")
"""How gloo / NCCL / the TCP store word a failed collective whose peer is gone (or never answered)."""
DEAD_PEER_WAIT_S = 2.0
"""How long to look for the dead peer among this host's processes: a socket closes a moment before its process is
reaped."""


class LostRank(UserError):
    """A peer rank of this run is gone: training stopped; the message names it and how to resume."""

    def __init__(self, message: str, *, resume: str = "rerun the same command") -> None:
        self.base = message
        super().__init__(f"{message}; resume with: {resume}")

    def with_command(self, command: str) -> LostRank:
        return LostRank(self.base, resume=command)


def is_peer_loss(err: BaseException) -> bool:
    """Whether err (or what it was raised from) is a collective that failed because a peer rank is gone."""
    import torch.distributed as dist

    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, getattr(dist, "DistNetworkError", ())) or (
                isinstance(err, RuntimeError) and any(m in str(err) for m in PEER_LOSS_MARKERS)):
            return True
        err = err.__cause__ or err.__context__
    return False


class RankWatch(Callback):
    """Turns a collective that failed for a lost peer into LostRank (see the module docstring)."""

    def __init__(self, run_path: Path) -> None:
        self.run_path = Path(run_path)
        self.peers: list[tuple[str, int]] = []
        """(host, pid) of every rank, by global rank; empty in a single-process run."""
        self.lost: LostRank | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        import torch.distributed as dist

        if trainer.world_size > 1 and dist.is_available() and dist.is_initialized():
            peers: list = [None] * trainer.world_size
            dist.all_gather_object(peers, (socket.gethostname(), os.getpid()))
            self.peers = [(str(h), int(p)) for h, p in peers]
            _spare_this_process()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        # Lightning calls this first when fit fails, before its teardown: the child watcher is stopped in time.
        if trainer.world_size < 2 or not is_peer_loss(exception):
            return
        _spare_this_process()
        self.lost = LostRank(self._describe(trainer))
        _end_children(trainer)

    def _describe(self, trainer: L.Trainer) -> str:
        me, world = trainer.global_rank, trainer.world_size
        host = socket.gethostname()
        others = [r for r in range(world) if r != me]
        deadline = time.monotonic() + DEAD_PEER_WAIT_S
        while True:
            local = [r for r in others if r < len(self.peers) and self.peers[r][0] == host]
            ended = [r for r in local if not _alive(self.peers[r][1])]
            # After the look above: a child seen ended is reaped here with its exit code.
            launched = {r: _returncode(trainer, r) for r in others}  # exit codes of the ranks this process started
            gone = [r for r in others if launched[r] is not None or r in ended]
            if gone or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if not gone:  # another host's rank (only its connection is seen from here), or the only peer there is
            gone = [r for r in others if r >= len(self.peers) or self.peers[r][0] != host] or others
        names = ", ".join(self._name(r, host, launched) for r in gone)
        what = f"rank {names} of {world} was lost" if len(gone) == 1 else f"ranks {names} of {world} were lost"
        where = _checkpoint_note(self.run_path)
        return (f"{what} at step {trainer.global_step}: training stopped, as the other ranks cannot go on without it "
                f"(this is rank {me}); {where}")

    def _name(self, rank: int, host: str, launched: dict[int, int | None]) -> str:
        """'1 (pid 6821 on this host, killed by SIGKILL)'."""
        if rank >= len(self.peers):
            return str(rank)
        peer_host, pid = self.peers[rank]
        where = "this host" if peer_host == host else peer_host
        code = launched.get(rank)
        if code is not None and code < 0:
            how = f", killed by {signal.Signals(-code).name}"
        elif code is not None:
            how = f", exited with {code}"
        elif peer_host != host:
            how = ", not answering"
        else:
            how = ""
        return f"{rank} (pid {pid} on {where}{how})"


def _checkpoint_note(run_path: Path) -> str:
    from recurlen.training.run_dir import RunDir, checkpoint_step

    last = RunDir(run_path).last_checkpoint
    step = checkpoint_step(last) if last.is_file() else None
    if step is None:
        return "no checkpoint was written yet, so the rerun starts over"
    return f"the run resumes exactly from {last} (step {step})"


def _alive(pid: int) -> bool:
    """Whether pid runs (a zombie, ended but not yet reaped by its parent, counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel whether the pid exists at all
        return pid_alive(pid)


def _returncode(trainer: L.Trainer, rank: int) -> int | None:
    """The exit code of a rank this process launched, None while it runs (or when another launched it)."""
    procs = getattr(trainer.strategy.launcher, "procs", None) or []
    i = rank - trainer.global_rank - 1  # the launcher's children are the next local ranks, in order
    if not 0 <= i < len(procs):
        return None
    try:  # wait, not poll: poll answers None while the child watcher's thread is polling the same child
        return procs[i].wait(timeout=0.01)
    except subprocess.TimeoutExpired:
        return None


def _spare_this_process() -> None:
    """Lightning's watcher of the ranks this process launched (a thread that looks every 5 s) SIGKILLs this process
    too once one of them has died, often before this process has said what happened (it notices at its next
    collective). From the start of training it ends only the launched ranks still running; this process stops at
    its next collective with the line."""
    for thread in threading.enumerate():
        if type(thread).__name__ == "_ChildProcessObserver" and hasattr(thread, "_child_processes"):
            thread._run = functools.partial(_look_at_children, thread._child_processes)


def _look_at_children(procs: list) -> bool:
    """One look of the watcher: True (done) once every child ended well, or once one failed and the others were
    ended."""
    codes = [p.poll() for p in procs]
    if all(code == 0 for code in codes):
        return True
    if not any(codes):
        return False
    for p in procs:
        if p.poll() is None:
            p.kill()
    return True


def _end_children(trainer: L.Trainer) -> None:
    """The ranks this process launched that still run wait in a collective that cannot complete: end them, as
    Lightning's watcher would have (this process says what happened, once)."""
    for p in getattr(trainer.strategy.launcher, "procs", None) or []:
        if p.poll() is None:
            p.kill()


__all__ = ["LostRank", "RankWatch", "is_peer_loss"]
