"""Helpers shared by the benchmark scripts: the environment header, thread setup, timing statistics, the float32
matmul peak, a training step timed in interleaved rounds, and one LM's training step against the peak."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


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
    """float32 FLOP/s of a (size x size) @ (size x size) matmul: the fastest of `repeats` after a warm-up."""
    return MatmulPeak(size=size, repeats=repeats).measure("once")


class MatmulPeak:
    """The float32 matmul peak, measured interleaved with the model: the denominator of every "% of peak".

    Measured once before the model runs, the peak comes out systematically low (measured again after the
    model, it was 1.3x higher on an idle 2-core machine and up to 3.3x under load): the first matmuls of a
    process pay for page faults, a cold thread pool and clocks that have not ramped up yet. So a benchmark
    measures it before the model, between its timed repeats and after, and divides by the largest: a peak
    is what the machine can do, and other jobs and cold starts only slow a measurement down. Every
    measurement is kept, with the load average (1 min) at the start and at the end, so that a reader sees
    how far they spread.
    """

    def __init__(self, *, size: int = 2048, repeats: int = 5, between_repeats: int = 2) -> None:
        self.size, self.repeats, self.between_repeats = size, repeats, between_repeats
        self.samples: list[tuple[str, float]] = []
        self.load_start = load_1min()
        self.load_end = self.load_start

    def measure(self, when: str, repeats: int | None = None) -> float:
        """Time the matmul (one untimed call, then the fastest of `repeats`); `when` is before/between/after."""
        a, b = torch.randn(self.size, self.size), torch.randn(self.size, self.size)
        out = torch.empty(self.size, self.size)
        torch.matmul(a, b, out=out)
        best = min(timed(lambda: torch.matmul(a, b, out=out)) for _ in range(repeats or self.repeats))
        flops = 2.0 * self.size**3 / best
        self.samples.append((when, flops))
        self.load_end = load_1min()
        return flops

    def between(self) -> float:
        return self.measure("between", self.between_repeats)

    def of(self, when: str) -> list[float]:
        return [f for w, f in self.samples if w == when]

    @property
    def denominator(self) -> float:
        if not self.samples:
            raise RuntimeError("MatmulPeak: no measurement yet; call measure('before') first")
        return max(f for _, f in self.samples)

    def summary(self) -> dict[str, float | None]:
        """GFLOP/s before (first), between (largest), after (last), the denominator, and the load at both ends."""
        def gflops(values: list[float], pick) -> float | None:
            return round(pick(values) / 1e9, 1) if values else None

        return {"before": gflops(self.of("before"), lambda v: v[0]), "between": gflops(self.of("between"), max),
                "after": gflops(self.of("after"), lambda v: v[-1]), "max": round(self.denominator / 1e9, 1),
                "load_start": self.load_start, "load_end": self.load_end}

    def report(self) -> str:
        s = self.summary()
        between = self.of("between")
        spread = (f", between the repeats {min(between) / 1e9:.1f} - {max(between) / 1e9:.1f} ({len(between)} times)"
                  if between else "")
        return (f"float32 matmul peak ({self.size}^3, fastest of {self.repeats}): {s['before']} GFLOP/s before the "
                f"model{spread}, {s['after']} after; '% of peak' divides by the largest, {s['max']} GFLOP/s "
                f"(before / largest = {s['before'] / s['max']:.2f}); load average (1 min) {s['load_start']:.2f} at "
                f"start, {s['load_end']:.2f} at end")


def load_1min() -> float:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return float("nan")


# ---------------------------------------------------------------------------------- the make bench table
LOAD_AT_IMPORT = load_1min()


def add_results_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--results", default=os.environ.get("RECURLEN_BENCH_RESULTS"), metavar="FILE",
                        help="append this run's headline rows to FILE (JSON lines; benchmarks/table.py prints them "
                             "as one table; default $RECURLEN_BENCH_RESULTS, which make bench sets)")


def record(path: str | None, **row: object) -> None:
    """Append one row of the make bench table (benchmarks/table.py documents the fields) to `path`, if given."""
    if path is None:
        return
    row.setdefault("load_start", LOAD_AT_IMPORT)
    row.setdefault("load_end", load_1min())
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def fmt_si(x: float, unit: str = "") -> str:
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:.2f} {prefix}{unit}"
    return f"{x:.2f} {unit}"


# ---------------------------------------------------------------------------------- a training step
def next_token_loss(logits: torch.Tensor, ids: torch.Tensor, vocab: int) -> torch.Tensor:
    logits = logits[..., :vocab]
    return F.cross_entropy(logits[:, :-1].reshape(-1, vocab), ids[:, 1:].reshape(-1))


ADAMW_IMPLS = {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def make_train_step(logits_fn, params, ids: torch.Tensor, vocab: int, *, adamw: str):
    """A closure running one step; it returns wall seconds of forward + backward and of the optimizer
    step, and the process CPU seconds of the whole step."""
    opt = torch.optim.AdamW(params, lr=1e-4, **ADAMW_IMPLS[adamw])

    def step() -> tuple[float, float, float]:
        cpu_start, start = time.process_time(), time.perf_counter()
        loss = next_token_loss(logits_fn(ids), ids, vocab)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        mid = time.perf_counter()
        opt.step()
        return mid - start, time.perf_counter() - mid, time.process_time() - cpu_start

    return step


@dataclass
class Timing:
    fwd_bwd: list[float] = field(default_factory=list)
    opt: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)

    @property
    def steps(self) -> list[float]:
        return [a + b for a, b in zip(self.fwd_bwd, self.opt)]


def run_interleaved(impls: dict, *, warmup: int, repeats: int, peak: MatmulPeak | None) -> dict[str, Timing]:
    """Time every implementation's step in rounds, one step each per round and the order rotated every round
    (A B C, B C A, ...), so that drift in machine load hits them alike; the matmul peak is measured again
    after every round (between the repeats)."""
    order = list(impls)
    for _ in range(warmup):
        for impl in order:
            impls[impl]()
    times = {impl: Timing() for impl in impls}
    for r in range(repeats):
        k = r % len(order)
        for impl in order[k:] + order[:k]:
            fwd_bwd, opt, cpu = impls[impl]()
            times[impl].fwd_bwd.append(fwd_bwd)
            times[impl].opt.append(opt)
            times[impl].cpu.append(cpu)
        if peak is not None:
            peak.between()
    return times


# ---------------------------------------------------------------------------------- one LM against the peak
def lm_peak_parser(doc: str, shapes: dict, *, default: str, quick: str) -> argparse.ArgumentParser:
    """The command line of a benchmark that times one LM's training step against the matmul peak (bench_gla
    and its like); `quick` says which shapes --quick runs."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=f"{quick}, 1 warm-up + 2 timed steps (make bench)")
    parser.add_argument("--shapes", nargs="+", choices=sorted(shapes), help=f"shapes to run (default: {default})")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=None, help="timed steps (default 3, quick 2)")
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--length", type=int, default=None)
    parser.add_argument("--peak-size", type=int, default=2048, help="matmul size for the float32 peak")
    parser.add_argument("--seed", type=int, default=0)
    add_results_option(parser)
    return parser


def start_lm_peak(args: argparse.Namespace, title: str, *, default: list[str], quick: list[str]) -> MatmulPeak:
    """What a --quick / full LM-against-the-peak run sets before its first shape: the shapes and timed steps (quick
    2, else 3) left unset on the command line, the threads, the environment header and the peak before the model."""
    args.shapes = args.shapes or (quick if args.quick else default)
    args.repeats = args.repeats or (2 if args.quick else 3)
    print_environment(title, set_threads(args.threads))
    peak = MatmulPeak(size=args.peak_size)
    peak.measure("before")
    return peak


def time_lm_step(model: torch.nn.Module, *, vocab: int, batch: int, length: int, flops_per_token: float,
                 args: argparse.Namespace, peak: MatmulPeak) -> dict:
    """One LM's training step (forward + next-token cross-entropy + backward + fused AdamW, float32) on a random
    batch, `args.warmup` untimed and `args.repeats` timed with the peak measured between them; prints the step
    line and returns tokens/s and model FLOP/s."""
    ids = torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(args.seed + 1))
    step = make_train_step(lambda x: model(x)[0], model.parameters(), ids, vocab, adamw="fused")
    t = run_interleaved({"recurlen": step}, warmup=args.warmup, repeats=args.repeats, peak=peak)["recurlen"]
    seconds = statistics.median(t.steps)
    flops = flops_per_token * batch * length / seconds
    print(f"step {seconds * 1e3:.0f} ms [{min(t.steps) * 1e3:.0f} - {max(t.steps) * 1e3:.0f}], fwd+bwd "
          f"{statistics.median(t.fwd_bwd) * 1e3:.0f} ms, AdamW {statistics.median(t.opt) * 1e3:.0f} ms; "
          f"{batch * length / seconds:.1f} tokens/s; {flops / 1e9:.1f} GFLOP/s")
    return {"tok_s": batch * length / seconds, "flops": flops}


def report_lm_shapes(results: dict[str, dict], peak: MatmulPeak, *, benchmark: str, path: str | None) -> None:
    """The peak's report and one summary line per shape (its fraction of the largest peak and of the one before the
    model, against its target if it has one); each shape's row goes to the make bench table."""
    print("\n" + peak.report())
    for name, r in results.items():
        fraction = r["flops"] / peak.denominator
        first = r["flops"] / peak.of("before")[0]
        target = r.get("target")
        verdict = "" if target is None else (f" (target >= {target:.0%}: "
                                             f"{'met' if fraction >= target else 'MISSED'})")
        print(f"summary {name}: {r['flops'] / 1e9:.1f} GFLOP/s = {fraction:.1%} of the largest peak{verdict}; "
              f"{first:.1%} of the peak measured before the model alone")
        record(path, benchmark=r.get("benchmark", benchmark), shape=r["shape"], unit="tokens/s", recurlen=r["tok_s"],
               peers={}, ratios={}, higher_is_better=True, pct_of_peak=fraction,
               target="" if target is None else f">= {target:.0%} of peak", peak=peak.summary())
