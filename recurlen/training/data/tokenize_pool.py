"""The worker processes that tokenize data.tokenize=needed's chunks (tokenize_worker.py), fed and read in order.

Chunk i goes to worker i % W over that worker's own pipes, so results come back in chunk order with no lock shared
between processes (multiprocessing.Pool's result queue has one: a worker stopped while it held it, or one left
writing a result nobody read, hung terminate() for ever). One loop writes tasks and reads results on every pipe that
is ready, so neither side ever waits on a full pipe.

A worker that owes a chunk is watched: one that ended is named with how it ended, one that used no CPU at all for
STALL_SECONDS (a deadlock, a process stopped with SIGSTOP) is stopped and named; the build then stops with one line
(WorkerLost) instead of waiting for ever. Closing the pool closes the pipes: each worker ends at its next read or
write, so no worker is stopped in the middle of anything, and one that goes on using the CPU is waited for.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import signal
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

from recurlen.training.data.tokenize_worker import HEADER, read_reply, task, unframe
from recurlen.util.errors import UserError

log = logging.getLogger(__name__)

POLL_SECONDS = 1.0
STALL_SECONDS = 60.0
"""A worker that owes a chunk and has used no CPU for this long is stalled: tokenizing even one huge document keeps
its CPU busy, and a process that waits on nothing for a minute waits for ever. Counted in polls of POLL_SECONDS, so
a whole machine or process group suspended and resumed counts as one poll, not as the time it was away."""


class WorkerLost(UserError):
    """A tokenize worker stalled or ended before returning a chunk: the build stops, what it appended stays."""


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process (Linux /proc); None where it cannot be read."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _how_it_ended(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


class _Worker:
    def __init__(self, number: int, spec: str, dtype: str) -> None:
        root = str(Path(__file__).resolve().parents[3])  # the recurlen this process runs, installed or not
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false",
               "PYTHONPATH": root + (os.pathsep + path if path else "")}
        self.number = number
        self.proc = subprocess.Popen([sys.executable, "-m", "recurlen.training.data.tokenize_worker", spec, dtype,
                                      str(os.getpid())], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self.stdin, self.stdout = self.proc.stdin.fileno(), self.proc.stdout.fileno()
        os.set_blocking(self.stdin, False)
        os.set_blocking(self.stdout, False)
        self.outgoing = bytearray()
        self.incoming = bytearray()
        self.owed: deque[int] = deque()
        self.results: dict[int, Any] = {}
        self.cpu: float | None = None
        self.idle_polls = 0
        self.lost: str | None = None
        """How it stalled or ended while it owed a chunk: raised when that chunk is wanted."""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def parse(self) -> None:
        while len(self.incoming) >= HEADER.size:
            size = HEADER.unpack_from(self.incoming)[0]
            if len(self.incoming) < HEADER.size + size:
                return
            header, body = unframe(bytes(self.incoming[HEADER.size:HEADER.size + size]))
            del self.incoming[:HEADER.size + size]
            self.results[header["index"]] = read_reply(header, body)
            self.owed.remove(header["index"])
            self.idle_polls = 0

    def close_pipes(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):  # a pipe the worker's end broke (nothing is buffered: os.write)
                pipe.close()


class _Pending:
    """A chunk handed to a worker, with the `get()` of the serial path's results."""

    def __init__(self, pool: WorkerPool, index: int) -> None:
        self.pool, self.index = pool, index

    def get(self):
        return self.pool.result(self.index)


class WorkerPool:
    """`workers` tokenize processes; submit(chunk).get() is the chunk's (tokens, lengths, hashes, rows)."""

    def __init__(self, workers: int, spec: str, dtype: str) -> None:
        self.workers: list[_Worker] = []
        self.selector = selectors.DefaultSelector()
        self.submitted = 0
        self._last_poll = time.monotonic()
        try:
            for number in range(workers):
                worker = _Worker(number, spec, dtype)
                self.workers.append(worker)
                self.selector.register(worker.stdout, selectors.EVENT_READ, (worker, "out"))
        except BaseException:
            self.close()
            raise

    def submit(self, chunk: list) -> _Pending:
        index, self.submitted = self.submitted, self.submitted + 1
        worker = self.workers[index % len(self.workers)]
        if not worker.outgoing:
            self.selector.register(worker.stdin, selectors.EVENT_WRITE, (worker, "in"))
        worker.outgoing += task(index, chunk)
        worker.owed.append(index)
        return _Pending(self, index)

    def result(self, index: int):
        worker = self.workers[index % len(self.workers)]
        while index not in worker.results:
            if worker.lost is not None:  # raised only now: the chunks before it, from the other workers, came first
                raise WorkerLost(f"tokenize worker {worker.number} (pid {worker.pid}) {worker.lost}")
            for key, _ in self.selector.select(timeout=POLL_SECONDS):
                owner, side = key.data
                self._write(owner) if side == "in" else self._read(owner)
            if time.monotonic() - self._last_poll >= POLL_SECONDS:
                self._last_poll = time.monotonic()
                for owner in self.workers:
                    self._watch(owner)
        reply = worker.results.pop(index)
        if len(reply) == 2:  # (the exception, its traceback in the worker)
            err, text = reply
            raise err from RuntimeError(f"in tokenize worker pid {worker.pid}:\n{text}")
        return reply

    def _write(self, worker: _Worker) -> None:
        try:
            sent = os.write(worker.stdin, worker.outgoing[:1 << 20])
        except BlockingIOError:
            return
        except BrokenPipeError:  # it ended: the end of its stdout says how
            sent = len(worker.outgoing)
        del worker.outgoing[:sent]
        if not worker.outgoing:
            self._unregister(worker.stdin)

    def _unregister(self, fd: int) -> None:
        # Idempotent: one select() can report both pipes of a worker that has just ended.
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(fd)

    def _read(self, worker: _Worker) -> None:
        try:
            data = os.read(worker.stdout, 1 << 20)
        except BlockingIOError:
            return
        if data:
            worker.incoming += data
            worker.parse()
            return
        # Its end (nothing else holds the pipe's other end): every result it sent was read before this.
        self._unregister(worker.stdin)
        self._unregister(worker.stdout)
        if worker.lost is None:
            when = (f"before returning chunk {worker.owed[0]} of this build" if worker.owed
                    else "while it waited for work")
            worker.lost = f"ended ({_how_it_ended(worker.proc.wait())}) {when}"

    def _watch(self, worker: _Worker) -> None:
        """One poll of a worker that owes a chunk: one that used no CPU for STALL_SECONDS of polls is stalled, and
        is stopped."""
        if worker.lost is not None or not worker.owed:
            worker.idle_polls = 0
            return
        cpu = cpu_seconds(worker.pid)
        worker.idle_polls = 0 if cpu is not None and cpu != worker.cpu else worker.idle_polls + 1
        worker.cpu = cpu
        if worker.idle_polls * POLL_SECONDS >= STALL_SECONDS:
            how = "used no CPU" if cpu is not None else "returned nothing"
            worker.lost = (f"stalled: it owes chunk {worker.owed[0]} of this build and {how} for "
                           f"{STALL_SECONDS:.0f} s, so it was stopped")
            worker.proc.kill()

    def close(self) -> None:
        """Close every worker's pipes and wait for it to end (at its next read or write: within the chunk it is on);
        one that stops using the CPU before it ends is stalled and is stopped."""
        for worker in self.workers:
            self._unregister(worker.stdin)
            self._unregister(worker.stdout)
            worker.close_pipes()
        self.selector.close()
        for worker in self.workers:
            worker.idle_polls, worker.cpu = 0, None
            while worker.proc.poll() is None:
                try:
                    worker.proc.wait(timeout=POLL_SECONDS)
                except subprocess.TimeoutExpired:
                    cpu = cpu_seconds(worker.pid)
                    worker.idle_polls = 0 if cpu is not None and cpu != worker.cpu else worker.idle_polls + 1
                    worker.cpu = cpu
                    if worker.idle_polls * POLL_SECONDS >= STALL_SECONDS:
                        log.warning("tokenize worker %d (pid %d) used no CPU for %.0f s after its build ended: "
                                    "stopped", worker.number, worker.pid, STALL_SECONDS)
                        worker.proc.kill()


__all__ = ["POLL_SECONDS", "STALL_SECONDS", "WorkerLost", "WorkerPool", "cpu_seconds"]
