"""Peak memory of a long forward run in segments with the recurrent state carried, against a short one.

    python benchmarks/bench_memory.py                 # tiny shape, 4k vs 64k tokens, every method
    python benchmarks/bench_memory.py --quick         # tiny shape, one process per measurement
    python benchmarks/bench_memory.py --shapes tiny 130m --lengths 4096 65536 262144 --segment 4096
    python benchmarks/bench_memory.py --arch mamba1 --shapes tiny 130m     # Mamba-1 (or --arch gla)

A recurrent model evaluated in segments of `--segment` tokens, passing the state on, should need the
same memory for 64k tokens as for 4k: only the per-token losses (4 bytes each) grow with length.
Each measurement runs in a fresh subprocess (batch 1, no grad, float32, backend='torch') that
computes the next-token log-likelihood of every token and keeps only that; the LM head runs on
--logits-rows positions at a time so that the vocabulary-sized logits do not dominate the peak. The
ratio long / short is printed per method (target <= 1.25x).

Methods:
  rss        peak resident set size minus the resident size just before the run. The peak counter
             (VmHWM) is reset after the model is built and warmed up (write "5" to /proc/self/clear_refs,
             Linux >= 4.0) so that model construction does not mask the run; where that is not allowed
             it falls back to resource.getrusage(RUSAGE_SELF).ru_maxrss. This is what the OS had to
             provide, glibc malloc's retained and fragmented heap included; median of --repeats runs.
  rss-mmap   the same with MALLOC_MMAP_THRESHOLD_=131072 in the worker's environment: every large
             buffer is its own mmap, returned to the OS when freed, so RSS follows live memory.
             The gap between rss and rss-mmap is allocator retention, not model memory.
  tensors    peak bytes of tensor storages alive at once, counted exactly: a TorchDispatchMode sees
             every op's outputs and a finalizer on each new storage subtracts it when it dies
             (storages that existed before the run, the weights and the token ids, are not counted).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import weakref

import _common
import torch
import torch.nn.functional as F

from recurlen.models.registry import architectures

TARGET_RATIO = 1.25
METHODS = ("rss", "rss-mmap", "tensors")
MMAP_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072"}  # setting it also turns off glibc's dynamic threshold


# ---------------------------------------------------------------------------------- worker side
def _proc_status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return _proc_status_kib("VmHWM") is not None


class TensorPeak:
    """Peak bytes of tensor storages alive at once, over the storages created inside the context.

    Ops also return views of tensors made before (`weight.t()` in every Linear): the storages of
    `existing` are never counted.
    """

    def __init__(self, existing: list[torch.Tensor]) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten

        tracker = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for t in tree_flatten(out)[0]:
                    if isinstance(t, torch.Tensor):
                        tracker._track(t.untyped_storage())
                return out

        self.mode = _Mode()
        self.live = 0
        self.peak = 0
        self._seen: set[int] = set()
        self._existing = {t.untyped_storage().data_ptr() for t in existing}

    def _track(self, storage: torch.UntypedStorage) -> None:
        key, nbytes = storage.data_ptr(), storage.nbytes()
        if nbytes == 0 or key in self._seen or key in self._existing:  # views, in-place results
            return
        self._seen.add(key)
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._free, key, nbytes)

    def _free(self, key: int, nbytes: int) -> None:
        self._seen.discard(key)
        self.live -= nbytes

    def __enter__(self) -> TensorPeak:
        self.mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.mode.__exit__(*exc)


def arch_presets(arch: str) -> dict:
    return architectures()[arch].presets


def build_model(arch: str, shape: str) -> torch.nn.Module:
    """A model of any registered architecture, by its preset name (tiny, 130m, 340m, ...), torch path."""
    entry = architectures()[arch]
    return entry.build(entry.preset(shape), backend="torch")


def run_worker(args: argparse.Namespace) -> dict:
    _common.set_threads(args.threads)
    torch.manual_seed(0)
    model = build_model(args.arch, args.shape).eval()
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (1, args.tokens + 1), generator=torch.Generator().manual_seed(1))
    nll = torch.empty(args.tokens)

    def run() -> None:
        state = None
        for start in range(0, args.tokens, args.segment):
            stop = min(start + args.segment, args.tokens)
            hidden, state = model.forward_hidden(ids[:, start:stop], state)
            # Logits a block of rows at a time: a whole segment's (4096 x 50k vocab) logits and
            # log-probabilities would be most of the peak and hide the model's own memory.
            for i in range(0, stop - start, args.logits_rows):
                j = min(i + args.logits_rows, stop - start)
                logits = model.logits_from_hidden(hidden[0, i:j]).float()
                targets = ids[0, start + i + 1:start + j + 1]
                nll[start + i:start + j] = F.cross_entropy(logits, targets, reduction="none")
                del logits
            del hidden  # else it stays alive through the next segment's forward

    result: dict = {}
    with torch.no_grad():
        model(ids[:, :16])  # one-time allocations (thread pools, MKL buffers) before the baseline
        gc.collect()
        start = time.perf_counter()
        if args.method == "tensors":
            with TensorPeak([*model.parameters(), *model.buffers(), ids, nll]) as tracker:
                run()
            result["peak_bytes"] = tracker.peak
        else:
            reset = _reset_peak_rss()
            before_kib = _proc_status_kib("VmRSS") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            run()
            peak_kib = _proc_status_kib("VmHWM") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            result.update(peak_bytes=(peak_kib - before_kib) * 1024, baseline_bytes=before_kib * 1024,
                          how="VmHWM reset" if reset else "ru_maxrss")
        result["seconds"] = time.perf_counter() - start
    result["mean_nll"] = nll.mean().item()
    return result


# ---------------------------------------------------------------------------------- driver side
def measure(shape: str, tokens: int, method: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--arch", args.arch, "--shape", shape,
           "--tokens", str(tokens),
           "--segment", str(args.segment), "--logits-rows", str(args.logits_rows), "--method", method]
    if args.threads is not None:
        cmd += ["--threads", str(args.threads)]
    env = {**os.environ, **(MMAP_ENV if method == "rss-mmap" else {})}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"worker {' '.join(cmd[2:])} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench_shape(shape: str, args: argparse.Namespace) -> dict[str, float]:
    """Peak memory at each length; returns peak(last) / peak(first) per method (and records them)."""
    mib = 2.0**20
    print(f"\n== {args.arch} {shape}: batch 1, segments of {args.segment} tokens")
    print(f"{'tokens':>8} {'segments':>8} {'method':>9} {'peak MiB':>9} {'runs (MiB)':>22} {'x first':>8} "
          f"{'run s':>6} {'tok/s':>7} {'mean nll':>9}")
    first: dict[str, float] = {}
    ratios: dict[str, float] = {}
    for tokens in args.lengths:
        for method in args.methods:
            runs = [measure(shape, tokens, method, args) for _ in range(1 if method == "tensors" else args.repeats)]
            peak = statistics.median(r["peak_bytes"] for r in runs)
            seconds = statistics.median(r["seconds"] for r in runs)
            first.setdefault(method, peak)
            ratios[method] = peak / max(first[method], 1)
            each = ", ".join(f"{r['peak_bytes'] / mib:.0f}" for r in runs) if len(runs) > 1 else ""
            note = ""
            if "how" in runs[0]:
                note = f"  ({runs[0]['how']}; RSS before {runs[0]['baseline_bytes'] / mib:.0f} MiB)"
            print(f"{tokens:>8} {-(-tokens // args.segment):>8} {method:>9} {peak / mib:>9.1f} {each:>22} "
                  f"{ratios[method]:>7.2f}x {seconds:>6.1f} {tokens / seconds:>7.0f} {runs[0]['mean_nll']:>9.4f}{note}")
    for method, ratio in ratios.items():
        _common.record(args.results, benchmark=f"{args.arch} forward memory ({method})", shape=f"{shape} 1x"
                       f"{args.lengths[-1]}", unit="MiB", recurlen=first[method] * ratio / mib,
                       peers={f"1x{args.lengths[0]}": first[method] / mib}, ratios={f"1x{args.lengths[0]}": ratio},
                       higher_is_better=False, target=f"<= {TARGET_RATIO}x")
        verdict = "met" if ratio <= TARGET_RATIO else "MISSED"
        print(f"{shape} {method:>9}: peak({args.lengths[-1]}) / peak({args.lengths[0]}) = {ratio:.2f}x "
              f"(target <= {TARGET_RATIO}x: {verdict})")
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one process per measurement (default 3 for rss)")
    parser.add_argument("--arch", choices=sorted(architectures()), default="mamba2",
                        help="a registered architecture (default: mamba2)")
    parser.add_argument("--shapes", nargs="+", default=["tiny"], help="model presets (default: tiny; add 130m)")
    parser.add_argument("--lengths", nargs="+", type=int, default=[4096, 65536],
                        help="total tokens per run; ratios are against the first (default: 4096 65536)")
    parser.add_argument("--segment", type=int, default=4096, help="tokens per forward call (default 4096)")
    parser.add_argument("--logits-rows", type=int, default=512,
                        help="positions per LM-head block when scoring a segment (default 512)")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--repeats", type=int, default=None, help="fresh processes per rss measurement; median")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads in the workers")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--shape", help=argparse.SUPPRESS)
    parser.add_argument("--tokens", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--method", choices=METHODS, help=argparse.SUPPRESS)
    _common.add_results_option(parser)
    args = parser.parse_args()
    if args.segment <= 0 or args.logits_rows <= 0 or any(n <= 0 for n in args.lengths):
        parser.error(f"--segment, --logits-rows and --lengths must be positive; got {args.segment}, "
                     f"{args.logits_rows}, {args.lengths}")
    if args.worker:
        print(json.dumps(run_worker(args)))
        return

    presets = arch_presets(args.arch)
    unknown = sorted(set(args.shapes) - set(presets))
    if unknown:
        parser.error(f"unknown {args.arch} shapes {unknown}; allowed: {sorted(presets)}")
    args.repeats = args.repeats or (1 if args.quick else 3)
    threads = _common.set_threads(args.threads)
    _common.print_environment("peak memory of a segmented forward with the state carried (no grad)", threads)
    import recurlen

    print(f"# recurlen from {os.path.dirname(recurlen.__file__)}; one fresh process per run; MiB = 2^20 bytes; "
          "'x first' = peak / peak at the first length")
    summary = {shape: bench_shape(shape, args) for shape in args.shapes}
    print("\nsummary: " + "; ".join(f"{shape} " + ", ".join(f"{m} {r:.2f}x" for m, r in ratios.items())
                                  for shape, ratios in summary.items()) + f" (target <= {TARGET_RATIO}x)")
    print(f"# load average at end: {_common.load_average()}")


if __name__ == "__main__":
    main()
