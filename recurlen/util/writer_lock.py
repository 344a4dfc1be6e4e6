"""One writer per directory: a lock held for the life of a run, refused at once to a second process.

Two files in the directory:
  writer.lock   an flock(2) taken through `filelock` (non-blocking): the kernel, or the file server on a shared
                file system, grants it to one process at a time and drops it when that process ends, however it ends
  writer.json   who holds it: host, pid, since when, the command, and a heartbeat rewritten every HEARTBEAT_S

A process that gets the flock still reads writer.json before it writes anything: a record left by a process that
is gone is taken over (on this host when its pid no longer runs; from another host when its heartbeat is older
than STALE_AFTER_S), one of a live holder is refused. The record is what protects a directory where flock is not
shared between machines (NFS mounted `nolock` / `local_lock`, Lustre `localflock`): see docs/faults.md.
Both files are removed when the lock is released: on every return or exception, and on SIGTERM / SIGHUP /
SIGUSR1 before the process ends the way the signal ends it.

A lock is its process's, never a forked child's: the child inherits the record of held locks and the signal handlers,
and a child stopped with SIGTERM used to release the parent's lock on its way out (its files removed while the parent
wrote on; a second run then started beside it). After a fork the child forgets every lock and gets its signals' earlier
handlers back (os.register_at_fork), and a lock acts only in the process that took it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

from recurlen.util.atomic_files import host_name, pid_alive, write_error, write_text
from recurlen.util.errors import UserError

log = logging.getLogger(__name__)

LOCK_FILE = "writer.lock"
RECORD_FILE = "writer.json"
HEARTBEAT_S = 30.0
"""How often the holder rewrites its heartbeat."""
STALE_AFTER_S = 300.0
"""A record from another host whose heartbeat is older than this belongs to a process that is gone (ten missed
heartbeats: far beyond a busy file system's pause, well within a requeued job's patience)."""
RELEASE_ON = ("SIGTERM", "SIGHUP", "SIGUSR1")
"""Signals whose default action would end the process with the lock still recorded (SIGINT raises
KeyboardInterrupt, which releases it on the way out)."""

_HELD: dict[str, WriterLock] = {}
"""The locks this process holds, by directory: a nested hold of the same directory reuses its lock."""


class LockHeld(UserError):
    """Another live process writes the directory."""


def _utc(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _ago(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def read_record(path: Path) -> dict | None:
    """The holder's record; None when there is none; {} when it is not a record (then only its age counts)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError:
        return {}
    try:
        record = json.loads(text)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def stale_reason(record: dict, *, now: float, modified: float, stale_after_s: float = STALE_AFTER_S) -> str | None:
    """Why the writer a record names is gone (its lock may be taken over), or None while it may still write."""
    host, pid = record.get("host"), record.get("pid")
    if host == host_name() and isinstance(pid, int):
        if pid == os.getpid():
            return "it is this process (a hold that was never released)"
        return None if pid_alive(pid) else f"pid {pid} no longer runs on this host"
    beat = record.get("heartbeat") if isinstance(record.get("heartbeat"), int | float) else modified
    age = now - beat
    if age > stale_after_s:
        return f"its last heartbeat is {_ago(age)} old (the limit for another host's writer: {_ago(stale_after_s)})"
    return None


def describe_holder(record: dict | None, *, now: float) -> str:
    """pid, host, since when and the last heartbeat of the writer a record names."""
    if not record:
        return "a process whose lock record is not written yet or unreadable"
    host = record.get("host", "?")
    where = f"this host ({host})" if host == host_name() else f"host {host}"
    beat = record.get("heartbeat")
    heard = f", last heartbeat {_ago(now - beat)} ago" if isinstance(beat, int | float) else ""
    return f"pid {record.get('pid', '?')} on {where} since {record.get('since', '?')}{heard}"


class WriterLock:
    """The single-writer lock of one directory (see the module docstring); `advice` ends a refusal."""

    def __init__(self, directory: str | os.PathLike, *, advice: str = "", stale_after_s: float = STALE_AFTER_S,
                 heartbeat_s: float = HEARTBEAT_S) -> None:
        self.directory = Path(directory)
        self.lock_path, self.record_path = self.directory / LOCK_FILE, self.directory / RECORD_FILE
        self.advice, self.stale_after_s, self.heartbeat_s = advice, stale_after_s, heartbeat_s
        self.token = uuid.uuid4().hex
        self.lost: dict | None = None
        """Set by the heartbeat when another process took the lock over (this one looked gone to it)."""
        self._flock = None
        self._created: list[Path] = []
        self._since = time.time()
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self._signals: dict[int, object] = {}
        self._pid = os.getpid()
        """The process that took it: only that one writes its record, removes its files or releases its flock."""

    # ----- acquire / release -----
    def acquire(self) -> WriterLock:
        from filelock import FileLock, Timeout

        # The directories this hold creates, deepest first: removed again if it ends before anything is written.
        self._created = [p for p in (self.directory, *self.directory.parents) if not p.exists()]
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._flock = FileLock(str(self.lock_path), timeout=0)
            self._flock.acquire()
        except Timeout:
            self._flock = None
            raise self._refusal(read_record(self.record_path), flock_held=True) from None
        except OSError as err:
            self._flock = None
            self._remove_created_directory()
            raise (write_error(err, self.lock_path) or err) from err
        record = read_record(self.record_path)
        if record is not None:
            now = time.time()
            why = stale_reason(record, now=now, modified=_mtime(self.record_path) or now,
                               stale_after_s=self.stale_after_s)
            if why is None:
                self._flock.release()
                self._flock = None
                raise self._refusal(record, flock_held=False)
            log.warning("taking over the writer lock of %s from %s: %s", self.directory,
                        describe_holder(record, now=now), why)
        try:
            self._write_record()
        except BaseException:
            self._release_files()
            raise
        self._pid = os.getpid()
        self._beat = threading.Thread(target=self._heartbeat, name=f"writer-lock {self.directory}", daemon=True)
        self._beat.start()
        self._catch_signals()
        _HELD[_key(self.directory)] = self
        return self

    def release(self) -> None:
        if self._flock is None or os.getpid() != self._pid:
            return
        _HELD.pop(_key(self.directory), None)
        self._restore_signals()
        self._stop.set()
        if self._beat is not None and self._beat is not threading.current_thread():
            self._beat.join(timeout=10)
        self._release_files()

    def _release_files(self) -> None:
        ours = self.lost is None and (read_record(self.record_path) or {}).get("token") in (self.token, None)
        with contextlib.suppress(OSError):
            if ours:
                self.record_path.unlink(missing_ok=True)
                # Unlinked while still held: a process that opened it meanwhile gets its flock on a removed file,
                # which filelock does not count as held, so no two processes ever hold locks on two different files.
                self.lock_path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self._flock.release()
        self._flock = None
        self._remove_created_directory()

    def _remove_created_directory(self) -> None:
        for directory in self._created:  # a run that stopped before writing anything leaves no directory behind
            try:
                directory.rmdir()
            except OSError:
                return

    def __enter__(self) -> WriterLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    def check(self) -> None:
        """UserError once another process has taken this lock over: stop before writing anything more."""
        if self.lost is not None:
            holder = describe_holder(self.lost, now=time.time())
            raise UserError(f"{self.directory}: the writer lock was taken over by {holder}, which found this "
                            f"process's heartbeat older than {_ago(self.stale_after_s)} (was it suspended?); stopped "
                            "so that the two do not mix their files; let one of them finish")

    # ----- the record and its heartbeat -----
    def _write_record(self) -> None:
        now = time.time()
        record = {"host": host_name(), "pid": os.getpid(), "since": _utc(self._since), "heartbeat": now,
                  "heartbeat_utc": _utc(now), "stale_after_s": self.stale_after_s, "token": self.token,
                  "command": " ".join(["recurlen", *sys.argv[1:]])[:300]}
        write_text(self.record_path, json.dumps(record, indent=1))

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            record = read_record(self.record_path)
            if record and record.get("token") != self.token:
                self.lost = record
                log.error("%s: another process took the writer lock over: %s", self.directory,
                          describe_holder(record, now=time.time()))
                return
            try:
                self._write_record()
            except (OSError, UserError) as err:  # a full or flaky file system: try again at the next beat
                log.warning("could not renew the writer lock record %s: %s", self.record_path, err)

    def _refusal(self, record: dict | None, *, flock_held: bool) -> LockHeld:
        now = time.time()
        text = (f"{self.directory} is being written by another process: {describe_holder(record, now=now)} (its "
                f"command is in {self.record_path}); two writers would mix their checkpoints and logs")
        gone = record and stale_reason(record, now=now, modified=_mtime(self.record_path) or now,
                                       stale_after_s=self.stale_after_s)
        if flock_held and gone:  # its record says gone, but the file system still grants its lock to someone
            text += (f"; its record says it is gone ({gone}), yet its lock is still held: by a process it left "
                     "behind (stop that one), or, on a shared file system, until the server expires the lost "
                     "machine's lock (minutes); then rerun")
        else:
            kill = f" (kill {record['pid']})" if record and record.get("host") == host_name() else ""
            text += f": wait for it to finish or stop it{kill}"
            if record and record.get("host") != host_name():
                beat = record.get("heartbeat") if isinstance(record.get("heartbeat"), int | float) else now
                text += (f" (if that machine is lost, its lock is taken over once its heartbeat is "
                         f"{_ago(self.stale_after_s)} old, after {_utc(beat + self.stale_after_s)})")
        return LockHeld(f"{text}{', or ' + self.advice if self.advice else ''}")

    # ----- signals -----
    def _catch_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for name in RELEASE_ON:
            signum = getattr(signal, name, None)
            if signum is not None and signal.getsignal(signum) is signal.SIG_DFL:
                self._signals[signum] = signal.SIG_DFL
                signal.signal(signum, self._on_signal)

    def _restore_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, handler in self._signals.items():
            if signal.getsignal(signum) == self._on_signal:
                signal.signal(signum, handler)
        self._signals = {}

    def _on_signal(self, signum: int, frame) -> None:
        if os.getpid() == self._pid:  # a forked child that kept this handler (another one calls it) ends untouched
            release_all()
        signal.signal(signum, signal.SIG_DFL)  # then end the way the signal ends a process (exit status 128 + n)
        os.kill(os.getpid(), signum)

    def _disown(self) -> None:
        """In a forked child: this is the parent's lock. The child's signals get their earlier handlers back, and
        the child never writes the record, removes the files or releases the flock (the flock belongs to the open
        file the two share: releasing it in the child releases it for the parent). Nothing here waits on a lock a
        parent's thread may have held at the fork (the heartbeat's event is left alone)."""
        for signum, handler in self._signals.items():
            with contextlib.suppress(ValueError, OSError):  # ValueError: not the child's main thread
                if signal.getsignal(signum) == self._on_signal:
                    signal.signal(signum, handler)
        self._signals, self._beat = {}, None


def _key(directory: Path) -> str:
    return os.path.realpath(directory)


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def release_all() -> None:
    """Release every lock this process holds (a signal is about to end it)."""
    for lock in list(_HELD.values()):
        lock.release()


def _forget_in_child() -> None:
    """os.fork's child (a multiprocessing or DataLoader worker, a pool's process): it holds none of its parent's
    locks (WriterLock._disown)."""
    for lock in list(_HELD.values()):
        lock._disown()
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def refusal(directory: str | os.PathLike, *, advice: str = "") -> LockHeld | None:
    """The refusal that taking the directory's writer lock would meet now (a live writer's record), or None; reads
    writer.json only, so it takes, creates and waits for nothing: a command says it in its first second, before the
    imports and the preflight, and a dry run says it too. The lock itself stays the judge (a process that starts
    between this look and its acquire, or a left-behind process that still holds the flock, is refused there)."""
    lock = WriterLock(directory, advice=advice)
    record = read_record(lock.record_path)
    if not record:  # none, or not a record: its age alone cannot tell a live writer here
        return None
    now = time.time()
    if record.get("host") == host_name() and record.get("pid") == os.getpid():
        return None  # this process's own hold
    if stale_reason(record, now=now, modified=_mtime(lock.record_path) or now, stale_after_s=lock.stale_after_s):
        return None  # gone: the run takes it over
    return lock._refusal(record, flock_held=False)


@contextlib.contextmanager
def hold(directory: str | os.PathLike, *, advice: str = "") -> Iterator[WriterLock]:
    """Hold the directory's writer lock for the block; a nested hold of a directory this process holds reuses it."""
    held = _HELD.get(_key(Path(directory)))
    if held is not None:
        yield held
        return
    with WriterLock(directory, advice=advice) as lock:
        yield lock


__all__ = ["HEARTBEAT_S", "LOCK_FILE", "RECORD_FILE", "STALE_AFTER_S", "LockHeld", "WriterLock", "hold",
           "read_record", "refusal", "release_all", "stale_reason"]
