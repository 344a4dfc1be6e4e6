"""The demo's training step with OpenMP's idle threads spinning (OMP_WAIT_POLICY=ACTIVE, the default) against
sleeping (PASSIVE, what recurlen sets on a busy machine: recurlen.util.threads.wait_passively_when_busy), on a quiet
machine and under a load this script makes: --busy processes that spin in pure Python beside the step.

    .venv/bin/python benchmarks/bench_wait_policy.py                 # 2 threads, quiet and 4 busy processes
    .venv/bin/python benchmarks/bench_wait_policy.py --quick         # fewer steps (make bench)

Each (load, policy) cell runs in its own process (OpenMP reads the policy when it starts), the policies alternating
round after round, and the step's final loss is printed beside its time: the policies must agree to the last bit.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time

import _common

STEP = r"""
import json, sys, time, torch
from recurlen.models import registry
threads, steps = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(threads)
torch.manual_seed(0)
model = registry.get("mamba2").build(registry.get("mamba2").preset("tiny"), backend="torch")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
ids = torch.randint(0, 256, (64, 33), generator=torch.Generator().manual_seed(1))
times = []
for i in range(steps + 2):
    t0 = time.perf_counter()
    logits, _ = model(ids[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
    opt.zero_grad(); loss.backward(); opt.step()
    if i >= 2:  # two warm-up steps
        times.append(time.perf_counter() - t0)
print(json.dumps({"times": times, "loss": loss.item()}))
"""


def spin(stop) -> None:
    while not stop.is_set():
        sum(range(10000))


def run_cell(policy: str, threads: int, steps: int) -> dict:
    env = {**os.environ, "OMP_WAIT_POLICY": policy, "OMP_NUM_THREADS": str(threads)}
    out = subprocess.run([sys.executable, "-c", STEP, str(threads), str(steps)], env=env, capture_output=True,
                         text=True, check=True, timeout=1800)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--busy", type=int, default=4, help="spinning processes for the loaded cells")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    _common.add_results_option(parser)
    args = parser.parse_args()
    if args.quick:
        args.steps, args.rounds = 5, 1
    print(f"# training step of the demo's Mamba-2 (batch 64 x 32), {args.threads} threads, {_common.cpu_name()}, "
          f"load at start {_common.load_1min():.1f}")
    rows = {}
    for load in (0, args.busy):
        stop = mp.Event()
        spinners = [mp.Process(target=spin, args=(stop,), daemon=True) for _ in range(load)]
        for p in spinners:
            p.start()
        time.sleep(1.0 if load else 0.0)
        try:
            cells: dict[str, list[float]] = {"ACTIVE": [], "PASSIVE": []}
            losses: dict[str, float] = {}
            for _ in range(args.rounds):
                for policy in cells:
                    res = run_cell(policy, args.threads, args.steps)
                    cells[policy] += res["times"]
                    losses[policy] = res["loss"]
        finally:
            stop.set()
            for p in spinners:
                p.join()
        med = {k: statistics.median(v) * 1000 for k, v in cells.items()}
        rows[load] = med
        same = "identical" if losses["ACTIVE"] == losses["PASSIVE"] else f"DIFFER ({losses})"
        print(f"{load} busy processes: ACTIVE {med['ACTIVE']:.0f} ms/step, PASSIVE {med['PASSIVE']:.0f} ms/step: "
              f"PASSIVE takes {med['PASSIVE'] / med['ACTIVE']:.2f}x ACTIVE's time; final losses {same}")
        _common.record(args.results, benchmark="wait_policy", shape=f"mamba2 tiny 64 x 32, {args.threads} threads, "
                       f"{load} busy processes", unit="ms/step", recurlen=med["PASSIVE"],
                       peers={"ACTIVE (OpenMP default)": med["ACTIVE"]},
                       ratios={"ACTIVE (OpenMP default)": med["ACTIVE"] / med["PASSIVE"]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
