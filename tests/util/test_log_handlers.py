"""Log lines reach the stderr that is current when they are written, not the one current at set-up."""

import io
import logging
import sys

from recurlen.commands.cli import _setup_logging
from recurlen.util.progress import TqdmHandler


def test_a_handler_without_a_stream_writes_to_the_stderr_of_the_moment(monkeypatch):
    handler = TqdmHandler()
    first, later = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    handler.emit(logging.makeLogRecord({"msg": "one"}))
    first.close()  # e.g. a test's captured stderr, closed when the test ends
    monkeypatch.setattr(sys, "stderr", later)
    handler.emit(logging.makeLogRecord({"msg": "two"}))
    assert later.getvalue() == "two\n"


def test_lightning_console_lines_survive_a_replaced_stderr(monkeypatch):
    lightning_log = logging.getLogger("lightning.pytorch")
    monkeypatch.setattr(lightning_log, "handlers", [])
    first, later = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    lightning_log.addHandler(logging.StreamHandler())  # as Lightning does at import: bound to this stderr
    _setup_logging()
    first.close()
    monkeypatch.setattr(sys, "stderr", later)
    monkeypatch.setattr(logging, "raiseExceptions", True)
    lightning_log.warning("after the swap")
    assert "after the swap" in later.getvalue() and "Logging error" not in later.getvalue()
