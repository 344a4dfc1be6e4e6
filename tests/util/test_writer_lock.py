"""The single-writer lock: a second process is refused at once naming the holder; a lock left by a dead process is
taken over (this host: by its pid; another host: by a heartbeat older than the limit); a live one never is; every
exit path, signals included, removes it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recurlen.util import writer_lock
from recurlen.util.atomic_files import host_name
from recurlen.util.errors import UserError
from recurlen.util.writer_lock import STALE_AFTER_S, LockHeld, WriterLock, hold, read_record

REPO = Path(__file__).resolve().parents[2]
HOLDER = ("import sys, time; from recurlen.util.writer_lock import WriterLock; "
          "WriterLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(120)")


@pytest.fixture
def holder(tmp_path):
    """`holder(directory)`: another process that holds the directory's writer lock (it imports no torch: fast)."""
    procs = []

    def start(directory: Path) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(directory)], cwd=REPO, stdout=subprocess.PIPE,
                                text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        procs.append(proc)
        assert proc.stdout.readline().strip() == "held"
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_a_second_process_is_refused_at_once_naming_the_holder_and_sigterm_releases(tmp_path, holder):
    run = tmp_path / "run"
    other = holder(run)
    record = read_record(run / "writer.json")
    assert record["pid"] == other.pid and record["host"] == host_name()
    start = time.monotonic()
    with pytest.raises(LockHeld) as refused:
        WriterLock(run, advice="choose another run_dir").acquire()
    assert time.monotonic() - start < 2
    assert str(refused.value).startswith(f"{run} is being written by another process: pid {other.pid} on this host "
                                         f"({host_name()}) since {record['since']}, last heartbeat ")
    assert f"wait for it to finish or stop it (kill {other.pid}), or choose another run_dir" in str(refused.value)
    other.send_signal(signal.SIGTERM)  # ends it the way SIGTERM ends a process, after removing the lock
    assert other.wait(timeout=30) == -signal.SIGTERM
    assert not run.exists()  # its lock files removed, and the directory its hold created
    with WriterLock(run):
        assert read_record(run / "writer.json")["pid"] == os.getpid()
    assert not run.exists()  # created by the hold, left empty: removed with it


def test_a_lock_left_by_kill_9_is_taken_over(tmp_path, holder, caplog):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("x")
    other = holder(run)
    other.kill()
    other.wait()
    assert read_record(run / "writer.json")["pid"] == other.pid  # nothing could remove it
    with caplog.at_level("WARNING", logger="recurlen.util.writer_lock"), WriterLock(run) as lock:
        assert read_record(run / "writer.json")["token"] == lock.token
    assert f"from pid {other.pid} on this host" in caplog.text and f"pid {other.pid} no longer runs" in caplog.text
    assert sorted(os.listdir(run)) == ["config.yaml"]  # the lock's files are gone, the run's are kept


def _foreign(run: Path, *, age: float) -> dict:
    record = {"host": "other-node", "pid": 4242, "since": "2026-01-01 00:00:00 UTC", "heartbeat": time.time() - age,
              "token": "f" * 32}
    run.mkdir(exist_ok=True)
    (run / "writer.json").write_text(json.dumps(record))
    return record


def test_another_hosts_lock_is_taken_over_only_once_its_heartbeat_is_older_than_the_limit(tmp_path):
    run = tmp_path / "run"
    _foreign(run, age=STALE_AFTER_S - 60)  # alive: its heartbeat is recent
    with pytest.raises(LockHeld, match=r"pid 4242 on host other-node since 2026-01-01 00:00:00 UTC, last heartbeat "
                                       r"4 min ago .*its lock is taken over once its heartbeat is 5 min old, after "):
        WriterLock(run).acquire()
    assert read_record(run / "writer.json")["host"] == "other-node"  # a refusal changes nothing
    _foreign(run, age=STALE_AFTER_S + 60)
    with WriterLock(run) as lock:
        assert read_record(run / "writer.json")["token"] == lock.token
    assert not (run / "writer.json").exists()


def test_the_heartbeat_renews_the_record_and_notices_a_takeover(tmp_path):
    run = tmp_path / "run"
    lock = WriterLock(run, heartbeat_s=0.05).acquire()
    try:
        first = read_record(run / "writer.json")["heartbeat"]
        deadline = time.time() + 10
        while read_record(run / "writer.json")["heartbeat"] == first and time.time() < deadline:
            time.sleep(0.02)
        assert read_record(run / "writer.json")["heartbeat"] > first
        lock.check()  # still ours
        _foreign(run, age=0)  # another host decided this process was gone and took the lock
        while lock.lost is None and time.time() < deadline:
            time.sleep(0.02)
        with pytest.raises(UserError, match="the writer lock was taken over by pid 4242 on host other-node"):
            lock.check()
    finally:
        lock.release()
    assert read_record(run / "writer.json")["host"] == "other-node"  # the new holder's record is left alone


def test_a_nested_hold_reuses_the_lock_and_a_file_in_the_path_is_one_line(tmp_path):
    run = tmp_path / "a" / "b"
    with hold(run) as outer, hold(run) as inner:
        assert inner is outer and writer_lock._HELD
    assert not (tmp_path / "a").exists() and not writer_lock._HELD  # every directory the hold created is gone
    (tmp_path / "f").write_text("x")
    with pytest.raises(UserError, match=f"cannot write {tmp_path}/f/run/writer.lock: {tmp_path}/f is a file, not a "
                                        "directory; choose another run_dir"):
        WriterLock(tmp_path / "f" / "run").acquire()


def _in_child(act) -> int:
    """Fork; the child runs `act()` and ends (by a signal `act` sends itself, or with exit status 0, or 1 when `act`
    raised); the child's wait status."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            act()
            code = 0
        finally:
            os._exit(code)
    return os.waitpid(pid, 0)[1]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_never_acts_on_its_parents_lock(tmp_path):
    """What a pool's terminate() did to a forked worker (SIGTERM), and what a child that unwinds or releases would do:
    the parent's lock files stay, the parent still holds the lock (another process is refused), and the child ends
    the way the signal ends a process."""
    run = tmp_path / "run"

    def release_everything() -> None:
        assert not writer_lock._HELD, "the child holds none of its parent's locks"
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, "the child's SIGTERM is the default again"
        writer_lock.release_all()
        lock.release()

    with hold(run) as lock:
        assert signal.getsignal(signal.SIGTERM) == lock._on_signal
        record = read_record(run / "writer.json")
        status = _in_child(lambda: os.kill(os.getpid(), signal.SIGTERM))
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM
        assert os.WIFEXITED(status := _in_child(release_everything)) and os.WEXITSTATUS(status) == 0
        # A handler that a library composed around the lock's (Lightning does) still calls it in the child.
        status = _in_child(lambda: lock._on_signal(signal.SIGTERM, None))
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM
        assert sorted(os.listdir(run)) == ["writer.json", "writer.lock"]
        assert read_record(run / "writer.json")["token"] == record["token"]
        code = "import sys; from recurlen.util.writer_lock import WriterLock; WriterLock(sys.argv[1]).acquire()"
        other = subprocess.run([sys.executable, "-c", code, str(run)], cwd=REPO, capture_output=True, text=True,
                               env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
        assert other.returncode == 1 and f"LockHeld: {run} is being written by another process: pid {os.getpid()}" \
            in other.stderr, other.stderr[-2000:]
    assert not run.exists()  # the parent's own release still removes everything
