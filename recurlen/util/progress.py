"""Log lines written through tqdm, so that they land above progress bars instead of inside them."""

from __future__ import annotations

import logging
import sys

from tqdm import tqdm


class TqdmHandler(logging.StreamHandler):
    """A logging handler that prints with tqdm.write (stderr), keeping any open progress bar intact.

    Without an explicit stream it writes to whatever sys.stderr is at the time of each record, not the one
    current when it was made: a handler kept across calls of the CLI in one process (tests, notebooks) would
    otherwise write to a stream that has since been replaced and closed."""

    def __init__(self, stream=None) -> None:
        super().__init__(stream)
        self._follows_stderr = stream is None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=sys.stderr if self._follows_stderr else self.stream)
        except Exception:  # pragma: no cover - logging must never raise
            self.handleError(record)


__all__ = ["TqdmHandler"]
