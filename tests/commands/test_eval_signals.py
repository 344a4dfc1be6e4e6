"""A stop signal during `recurlen eval`: one line and exit 128 + the signal, as training and the demo (Ctrl-C printed
a 77-line KeyboardInterrupt traceback, SIGTERM ended the process by its default action)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recurlen.training.finetune import run_finetune

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, experiment):
    return run_finetune(experiment(tmp_path_factory.mktemp("signals") / "run"))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_signal_during_the_evaluation_is_one_line_and_128_plus_the_signal(tmp_path, run_dir, signum):
    out, log = tmp_path / "eval", tmp_path / "stderr"
    with open(log, "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "recurlen", "eval", str(run_dir), "seq_len=4096",
                                 "num_sequences=4", "num_threads=1", "--out", str(out)], cwd=REPO,
                                stdout=subprocess.DEVNULL, stderr=stderr,
                                env={**os.environ, "PYTHONPATH": str(REPO)})
        try:
            deadline = time.monotonic() + 120
            while "position-wise" not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)  # the evaluation has begun: the model is loaded, the held-out data read
            assert proc.poll() is None, log.read_text()[-3000:]
            proc.send_signal(signum)
            rc = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    err = log.read_text()
    name = signal.Signals(signum).name
    assert rc == 128 + signum and "Traceback" not in err, err[-3000:]
    assert err.rstrip().splitlines()[-1].split("\r")[-1].strip().endswith(
        f"recurlen eval: interrupted by {name} during the evaluation, before its results.json was written to {out}; "
        "rerun the same command to evaluate"), err[-3000:]
    assert not (out / "results.json").exists()
