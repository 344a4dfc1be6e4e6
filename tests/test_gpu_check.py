"""make gpu-check on a machine without a GPU: it stops at once with a clear message (and installs nothing)."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_make_gpu_check_without_a_gpu_fails_cleanly_before_installing(tmp_path):
    env = {**os.environ, "GPU_VENV": str(tmp_path / "venv-gpu"), "PATH": "/usr/bin:/bin"}  # no nvidia-smi
    done = subprocess.run(["make", "--no-print-directory", "gpu-check"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0
    assert "gpu-check: no NVIDIA GPU found" in done.stderr and "make test-kernels" in done.stderr
    assert not (tmp_path / "venv-gpu").exists()


def test_gpu_check_script_without_cuda_writes_why_and_exits_2(tmp_path):
    out = tmp_path / "summary.json"
    done = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "gpu-check: no CUDA device" in done.stderr
    summary = json.loads(out.read_text())
    assert summary["ok"] is False and "no CUDA device" in summary["error"] and summary["steps"] == {}


def test_gpu_check_help_lists_its_options():
    done = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--help"], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0
    for option in ("--out", "--steps", "--batch", "--eval-len", "--quick"):
        assert option in done.stdout
