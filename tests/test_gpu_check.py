"""make gpu-check on a machine without a GPU: it stops at once with a clear message (and installs nothing); its
comparison with mamba-ssm's own model, rehearsed on a CPU; its time budget and MFU denominator."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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



def test_the_development_doc_describes_the_check_the_script_runs(monkeypatch):
    """docs/development.md's gpu-check section states the script's targets, shapes and defaults (it described the
    retired 10x-the-torch-path target and 20 steps per intervention after the script had moved on)."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    monkeypatch.setattr(sys, "argv", ["gpu_check.py"])
    import gpu_check
    import gpu_peer

    args = gpu_check.parse_args()
    doc = (REPO / "docs" / "development.md").read_text()
    section = doc[doc.index("## `make gpu-check`"):doc.index("### Measured on one H200")]
    assert f"recurlen >= {gpu_peer.TOKENS_PER_S_TARGET}x mamba-ssm's tokens/s at <= its peak memory" in section
    assert f"`--steps` (default {args.steps})" in section and f"default {args.budget_s:.0f} s" in section
    for shape, batch in gpu_peer.SHAPES.items():
        assert f"{shape} shape ({batch} x 2048" in section, shape
    assert "within 10 minutes" in section and "MambaLMHeadModel" in section and "--cpu-rehearsal" in section
    assert "10x" not in section and "20 steps" not in section

# --------------------------------------------------------------------------------------------- the peer comparison
@pytest.fixture(autouse=True)
def benchmarks_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))


def test_mfu_denominator_is_the_data_sheet_bf16_peak_of_the_device_name():
    from gpu_peer import bf16_peak_flops

    assert bf16_peak_flops("NVIDIA H100 80GB HBM3") == 989.4e12
    assert bf16_peak_flops("NVIDIA H100 PCIe") == 756.0e12
    assert bf16_peak_flops("NVIDIA H200") == 989.4e12
    assert bf16_peak_flops("NVIDIA A100-SXM4-80GB") == 312.0e12
    assert bf16_peak_flops("Some Future GPU") is None  # then the measured matmul peak is the denominator


def test_a_part_the_time_budget_has_no_room_for_is_skipped_and_written(tmp_path):
    import argparse

    from gpu_check import Summary

    summary = Summary(tmp_path / "summary.json", argparse.Namespace(quick=False))
    ran = []
    assert summary.part("first", lambda: ran.append(1) or {"x": 1}, budget=100, needs_s=10) == {"x": 1, "seconds": 0.0}
    assert summary.part("second", lambda: ran.append(2) or {}, budget=100, needs_s=1000) is None
    written = json.loads((tmp_path / "summary.json").read_text())
    assert ran == [1] and written["skipped"] == ["second"] and written["steps"]["first"]["x"] == 1
    assert "time budget" in written["steps"]["second"]["skipped"]


@pytest.mark.slow
def test_cpu_rehearsal_runs_the_comparison_with_mamba_ssm_end_to_end(tmp_path):
    """--cpu-rehearsal: recurlen's kernel path and mamba-ssm's MambaLMHeadModel run their real Triton kernels under
    the interpreter, and the JSON holds what a GPU run's does. Slow: the interpreter takes minutes on 2 cores."""
    import importlib.util

    missing = [p for p in ("mamba_ssm", "triton") if importlib.util.find_spec(p) is None]
    if missing:
        pytest.skip(f"{missing} not installed (make test-kernels installs them)")
    out = tmp_path / "rehearsal.json"
    done = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--cpu-rehearsal", "--rounds", "1", "--out",
                           str(out)], cwd=REPO, capture_output=True, text=True, timeout=3600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads(out.read_text())
    part = summary["steps"]["train_step_vs_mamba_ssm_rehearsal"]
    assert summary["ok"] is True and summary["rehearsal"] is True and part["rounds_done"] == 1
    assert part["same_function"]["ok"] and part["same_function"]["logits_rel_diff"] < 1e-4  # the same weights
    assert part["recurlen_head_loss"] == "chunked" and part["tokens_per_step"] == 32
    assert set(part["peers"]) == {"recurlen", "recurlen_plain_loss", "mamba_ssm"}
    for name, row in part["peers"].items():
        assert row["tokens_per_s"] > 0 and row["peak_gib"] > 0 and 0 < row["mfu"] < 1, name
        assert len(row["step_ms"]) == 1, name
    versus = part["recurlen_vs_mamba_ssm"]
    assert versus["tokens_per_s_ratio"] > 0 and versus["peak_memory_ratio"] > 0 and isinstance(versus["met"], bool)
    assert summary["targets"]["train_step_vs_mamba_ssm_rehearsal"] == versus
    assert part["mfu_denominator"] == "measured float32 matmul peak" and part["matmul_peak"]["measured_tflops"] > 0
