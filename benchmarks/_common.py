"""Helpers shared by the benchmark scripts: the environment header, thread setup and timing statistics."""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable

import torch


def set_threads(threads: int | None) -> int:
    """Use `threads` intra-op threads (default: what torch picked, i.e. the physical cores)."""
    if threads is not None:
        if threads <= 0:
            raise ValueError(f"--threads must be a positive integer; got {threads}")
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def load_average() -> str:
    try:
        return "/".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def print_environment(title: str, threads: int) -> None:
    print(f"# {title}")
    print(f"# torch {torch.__version__} | {cpu_name()} | {os.cpu_count()} logical CPUs | torch threads {threads} "
          f"| MKL {torch.backends.mkl.is_available()} | oneDNN {torch.backends.mkldnn.is_available()}")
    print(f"# load average (1/5/15 min) at start: {load_average()}  (other processes on the machine skew timings)")


def measure_matmul_peak(*, size: int, repeats: int) -> float:
    """float32 FLOP/s of a (size x size) @ (size x size) matmul: the fastest of `repeats` after a warm-up.

    The fastest, not the median: a peak is what the machine can do, and other jobs only slow runs down.
    """
    a = torch.randn(size, size)
    b = torch.randn(size, size)
    out = torch.empty(size, size)
    torch.matmul(a, b, out=out)
    return 2.0 * size**3 / min(timed(lambda: torch.matmul(a, b, out=out)) for _ in range(repeats))


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def fmt_si(x: float, unit: str = "") -> str:
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:.2f} {prefix}{unit}"
    return f"{x:.2f} {unit}"
