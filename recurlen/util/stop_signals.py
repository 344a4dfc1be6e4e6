"""A stop signal during work that keeps no checkpoint: stop where it is, one line, exit 128 + the signal number.

Training turns SIGTERM / SIGUSR1 / SIGINT into a checkpoint and a stop (recurlen.training.preemption); the demo
passes them on to its stages and, during its own evaluation, stops that where it is (recurlen.commands.demo). Work
with nothing to save on the way, such as `recurlen eval` (its results.json and plots are written at its end), does
what the demo's evaluation does: `Interrupted(signum, during=...)`, which the command line prints as one line,
`recurlen eval: interrupted by SIGINT during ...`, and exits with 128 + the signal number (130 for Ctrl-C), where
Ctrl-C used to print Python's KeyboardInterrupt traceback.

The handler raises a BaseException, as KeyboardInterrupt is one, so that no `except Exception` on the way (a
checkpoint load that turns any error into "cannot be loaded") mistakes the signal for a failure of its own; the
block turns it into Interrupted on its way out.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

from recurlen.util.errors import Interrupted

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


class _Stopped(BaseException):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def stopped_by_signals(during: str) -> Iterator[None]:
    """A stop signal inside the block raises Interrupted(signum, during=`during`) (`during`: what was stopped and
    what was kept). Outside the main thread, where no handler can be set, the signals keep what they do."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame) -> None:
        raise _Stopped(signum)

    previous = {s: signal.signal(s, stop) for s in STOP_SIGNALS}
    try:
        yield
    except _Stopped as stopped:
        raise Interrupted(stopped.signum, step=0, checkpoint=None, during=during) from None
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


__all__ = ["STOP_SIGNALS", "stopped_by_signals"]
