"""Log lines written through tqdm, so that they land above progress bars instead of inside them."""

from __future__ import annotations

import logging

from tqdm import tqdm


class TqdmHandler(logging.StreamHandler):
    """A logging handler that prints with tqdm.write (stderr), keeping any open progress bar intact."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # pragma: no cover - logging must never raise
            self.handleError(record)


__all__ = ["TqdmHandler"]
