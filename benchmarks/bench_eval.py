"""Cost of recurlen's evaluations on CPU with the tiny model (a script, not a test).

1. Position-wise evaluation (full pass + reset control + state statistics, chunk 2048) at 4k, 16k
   and 64k tokens, each size in a fresh subprocess so that ru_maxrss (the peak resident set, which
   sees every tensor torch allocates, unlike tracemalloc) belongs to that size alone. The peer, in
   the same run: one unchunked forward of the whole sequence, whose memory grows with L.
   Targets: peak memory(64k) <= 1.25 x peak memory(4k); time(64k) / time(4k) <= 17 (linear is 16).
2. EffRem: time vs the number of suffix tokens it must read (sum over t of T - t), batched
   (suffixes as batch rows, one sequential call per grid segment) vs naive (each suffix on its own).

    .venv/bin/python benchmarks/bench_eval.py [--sizes 4096 16384 65536] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import _common

SIZES = (4096, 16384, 65536)
CHUNK = 2048


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def worker(mode: str, tokens: int, threads: int | None) -> dict:
    import torch
    import torch.nn.functional as F

    from recurlen import Mamba2LM, preset
    from recurlen.diagnostics.positionwise import evaluate_positionwise

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = Mamba2LM(preset("tiny"), backend="torch").eval()
    ids_1L = torch.randint(0, 257, (1, tokens))
    warm_1L = torch.randint(0, 257, (1, 2 * CHUNK))
    # Warm up at a tiny size so that allocator arenas and lazy inits are in the baseline for every size.
    evaluate_positionwise(model, warm_1L, train_len=CHUNK // 4, chunk_len=CHUNK)
    baseline = _rss_mb()
    start = time.perf_counter()
    if mode == "chunked":
        evaluate_positionwise(model, ids_1L, train_len=CHUNK // 4, chunk_len=CHUNK, state_points=48)
    else:  # the unchunked peer: one forward over the whole sequence
        with torch.no_grad():
            logits, _ = model(ids_1L)
            F.cross_entropy(logits[0, :-1], ids_1L[0, 1:])
    return {"mode": mode, "tokens": tokens, "time_s": time.perf_counter() - start, "peak_rss_mb": _rss_mb(),
            "baseline_rss_mb": baseline}


def run_worker(mode: str, tokens: int, threads: int | None) -> dict:
    cmd = [sys.executable, __file__, "--worker", mode, "--tokens", str(tokens)]
    if threads:
        cmd += ["--threads", str(threads)]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_positionwise(sizes: list[int], threads: int | None, results: str | None) -> None:
    rows = [(run_worker("chunked", n, threads), run_worker("unchunked", n, threads)) for n in sizes]
    base_c, base_u = rows[0]
    print(f"\nposition-wise evaluation, tiny model, chunk {CHUNK}, fresh process per size "
          "(peak = ru_maxrss; delta = peak - RSS after model load and warm-up)")
    print(f"{'tokens':>7} | {'chunked s':>9} {'x':>6} {'peak MB':>8} {'x':>5} {'delta MB':>8} | "
          f"{'unchunked s':>11} {'x':>6} {'peak MB':>8} {'x':>5} {'delta MB':>8}")
    for c, u in rows:
        print(f"{c['tokens']:>7} | {c['time_s']:>9.2f} {c['time_s'] / base_c['time_s']:>6.2f} "
              f"{c['peak_rss_mb']:>8.0f} {c['peak_rss_mb'] / base_c['peak_rss_mb']:>5.2f} "
              f"{c['peak_rss_mb'] - c['baseline_rss_mb']:>8.1f} | "
              f"{u['time_s']:>11.2f} {u['time_s'] / base_u['time_s']:>6.2f} "
              f"{u['peak_rss_mb']:>8.0f} {u['peak_rss_mb'] / base_u['peak_rss_mb']:>5.2f} "
              f"{u['peak_rss_mb'] - u['baseline_rss_mb']:>8.1f}")
    first, last = rows[0][0], rows[-1][0]
    mem_ratio = last["peak_rss_mb"] / first["peak_rss_mb"]
    time_ratio = last["time_s"] / first["time_s"]
    scale = last["tokens"] / first["tokens"]
    mem_ok = mem_ratio <= 1.25
    time_ok = time_ratio <= 17 * scale / 16
    _common.record(results, benchmark="position-wise eval memory", shape=f"tiny 1x{last['tokens']}", unit="MB",
                   recurlen=last["peak_rss_mb"], peers={f"1x{first['tokens']}": first["peak_rss_mb"]},
                   ratios={f"1x{first['tokens']}": mem_ratio}, higher_is_better=False, target="<= 1.25x")
    _common.record(results, benchmark="position-wise eval time", shape=f"tiny 1x{last['tokens']}", unit="s",
                   recurlen=last["time_s"], peers={f"1x{first['tokens']}": first["time_s"]},
                   ratios={f"1x{first['tokens']}": time_ratio}, higher_is_better=False,
                   target=f"<= {17 * scale / 16:.0f}x (linear {scale:.0f}x)")
    print(f"target memory({last['tokens']})/memory({first['tokens']}) <= 1.25: {mem_ratio:.3f} "
          f"{'PASS' if mem_ok else 'FAIL'}")
    print(f"target time ratio <= {17 * scale / 16:.0f} (linear: {scale:.0f}): {time_ratio:.2f} "
          f"{'PASS' if time_ok else 'FAIL'}")


def bench_effrem(threads: int | None, context_len: int = 4096) -> None:
    import torch

    from recurlen import Mamba2LM, preset
    from recurlen.diagnostics.effrem import default_t_grid, effrem_batch, suffix_tokens
    from recurlen.diagnostics.positionwise import score_positions
    from recurlen.evaluation.generation import prefill

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = Mamba2LM(preset("tiny"), backend="torch").eval()
    ids_1T = torch.randint(0, 257, (1, context_len))
    effrem_batch(model, ids_1T[:, :256], [0, 128])  # warm-up
    start = time.perf_counter()
    score_positions(model, ids_1T, ends=list(range(CHUNK, context_len, CHUNK)) + [context_len])
    plain = time.perf_counter() - start
    print(f"\nEffRem_T, T={context_len}, tiny model, 1 sequence; peer: one plain chunked pass over T tokens "
          f"({plain:.2f} s, {context_len / plain:,.0f} tok/s)")
    print(f"{'points':>6} {'suffix tok':>10} {'x T':>5} | {'batched s':>9} {'x plain':>7} {'tok/s':>9} | "
          f"{'naive s':>8} {'x plain':>7} | {'naive/batched':>13}")
    for points in (5, 9, 17):
        grid = default_t_grid(context_len, points)
        tokens = suffix_tokens(context_len, grid)
        start = time.perf_counter()
        tv_G1 = effrem_batch(model, ids_1T, grid, chunk_len=CHUNK)
        batched = time.perf_counter() - start
        start = time.perf_counter()  # naive: every suffix run separately, then one TV per t
        with torch.no_grad():
            p_full = torch.softmax(prefill(model, ids_1T, chunk_len=CHUNK)[0].double(), -1)
            naive_G = [0.5 * (torch.softmax(prefill(model, ids_1T[:, t:], chunk_len=CHUNK)[0].double(), -1)
                              - p_full).abs().sum().item() for t in grid]
        naive = time.perf_counter() - start
        assert max(abs(a - b) for a, b in zip(tv_G1[:, 0].tolist(), naive_G)) < 1e-4
        print(f"{points:>6} {tokens:>10} {tokens / context_len:>5.1f} | {batched:>9.2f} {batched / plain:>7.2f} "
              f"{tokens / batched:>9,.0f} | {naive:>8.2f} {naive / plain:>7.2f} | {naive / batched:>13.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--skip-effrem", action="store_true")
    parser.add_argument("--worker", choices=["chunked", "unchunked"], help=argparse.SUPPRESS)
    parser.add_argument("--tokens", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="4k and 16k tokens only, no EffRem (make bench)")
    _common.add_results_option(parser)
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.skip_effrem = [s for s in args.sizes if s <= 16384] or args.sizes[:1], True
    if args.worker:
        print(json.dumps(worker(args.worker, args.tokens, args.threads)))
        return
    bench_positionwise(sorted(args.sizes), args.threads, args.results)
    if not args.skip_effrem:
        bench_effrem(args.threads)


if __name__ == "__main__":
    main()
