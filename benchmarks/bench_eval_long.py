"""Position-wise evaluation at the official 130m shape on CPU: tokens/s and peak memory at 4k, 32k and 128k tokens.

What `recurlen eval` does to one held-out sequence, through the same function (evaluate_positionwise): batch 1,
chunks of 2048 tokens with the state carried, T = 2048, state statistics at every chunk end and 48 log-spaced
points; the reset control (off here unless --reset) scores the same tokens a second time and doubles the time,
not the memory. Random weights (the cost does not depend on them), float32, backend='torch'.

Every length runs in a fresh subprocess. Peak memory is the process's peak resident set (VmHWM, i.e.
ru_maxrss), the model's weights and the libraries included, since that is what a machine must provide;
"run MiB" is that peak minus the resident size just before the evaluation started. Targets:
peak(128k) <= 1.25 x peak(4k), and time roughly linear in length (time ratio within 10% of the length ratio).

    .venv/bin/python benchmarks/bench_eval_long.py [--lengths 4096 32768 131072] [--shape 130m] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import _common

CHUNK = 2048
TRAIN_LEN = 2048
MEMORY_TARGET = 1.25
TIME_SLACK = 1.10


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def worker(args: argparse.Namespace) -> dict:
    import torch

    from recurlen import Mamba2LM, preset
    from recurlen.diagnostics.positionwise import evaluate_positionwise

    _common.set_threads(args.threads)
    torch.manual_seed(0)
    model = Mamba2LM(preset(args.shape), backend="torch").eval()
    vocab = model.config.vocab_size
    ids_1L = torch.randint(0, vocab, (1, args.tokens), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model(ids_1L[:, :16])  # thread pools and one-time buffers before the clock starts
    before_kib = _status_kib("VmRSS")
    start = time.perf_counter()
    result = evaluate_positionwise(model, ids_1L, train_len=TRAIN_LEN, chunk_len=CHUNK, batch_size=1,
                                   reset_control=args.reset, state_stats=True)
    seconds = time.perf_counter() - start
    passes = 2 if args.reset else 1
    return {"tokens": args.tokens, "seconds": seconds, "tokens_per_s": passes * args.tokens / seconds,
            "peak_mib": _status_kib("VmHWM") / 1024, "before_mib": before_kib / 1024,
            "mean_nll": float(result.nll_sum_P.mean())}


def measure(tokens: int, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--tokens", str(tokens), "--shape", args.shape]
    if args.threads is not None:
        cmd += ["--threads", str(args.threads)]
    if args.reset:
        cmd.append("--reset")
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"worker for {tokens} tokens failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 32768, 131072],
                        help="tokens of the held-out sequence; ratios are against the first")
    parser.add_argument("--shape", default="130m", help="Mamba-2 preset (default 130m)")
    parser.add_argument("--reset", action="store_true", help="also run the reset control (twice the time)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--quick", action="store_true", help="4k and 8k tokens only (make bench)")
    _common.add_results_option(parser)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tokens", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    if args.quick:
        args.lengths = [4096, 8192]
    if any(n <= TRAIN_LEN for n in args.lengths):
        parser.error(f"--lengths must exceed the training context {TRAIN_LEN}; got {args.lengths}")
    threads = _common.set_threads(args.threads)
    _common.print_environment(f"position-wise evaluation at the {args.shape} shape, batch 1, chunks of {CHUNK}, "
                              f"T = {TRAIN_LEN}, {'with' if args.reset else 'without'} the reset control", threads)
    print("# one fresh process per length; peak = the process's VmHWM (peak RSS, weights included); "
          "'x first' = against the first length")
    print(f"{'tokens':>7} | {'seconds':>8} {'x first':>7} {'linear':>6} {'tok/s':>6} | "
          f"{'peak MiB':>8} {'x first':>7} {'run MiB':>7} | {'mean nll':>8}")
    rows = [measure(n, args) for n in args.lengths]
    first = rows[0]
    for r in rows:
        print(f"{r['tokens']:>7} | {r['seconds']:>8.1f} {r['seconds'] / first['seconds']:>7.2f} "
              f"{r['tokens'] / first['tokens']:>6.0f} {r['tokens_per_s']:>6.0f} | {r['peak_mib']:>8.0f} "
              f"{r['peak_mib'] / first['peak_mib']:>6.2f}x {r['peak_mib'] - r['before_mib']:>7.0f} | "
              f"{r['mean_nll']:>8.4f}", flush=True)
    last = rows[-1]
    mem_ratio = last["peak_mib"] / first["peak_mib"]
    scale = last["tokens"] / first["tokens"]
    time_ratio = last["seconds"] / first["seconds"]
    _common.record(args.results, benchmark="position-wise eval memory (VmHWM)", shape=f"{args.shape} 1x"
                   f"{last['tokens']}", unit="MiB", recurlen=last["peak_mib"], peers={f"1x{first['tokens']}":
                   first["peak_mib"]}, ratios={f"1x{first['tokens']}": mem_ratio}, higher_is_better=False,
                   target=f"<= {MEMORY_TARGET}x")
    print(f"target peak({last['tokens']}) / peak({first['tokens']}) <= {MEMORY_TARGET}: {mem_ratio:.2f}x "
          f"{'met' if mem_ratio <= MEMORY_TARGET else 'MISSED'}")
    print(f"target time({last['tokens']}) / time({first['tokens']}) <= {TIME_SLACK} x {scale:.0f} (linear): "
          f"{time_ratio:.1f} {'met' if time_ratio <= TIME_SLACK * scale else 'MISSED'}")
    print(f"# load average at end: {_common.load_average()}")


if __name__ == "__main__":
    main()
