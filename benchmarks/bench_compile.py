"""trainer.compile=true against eager: a training step of the same model on the same batch, side by side, on CPU.

    python benchmarks/bench_compile.py                 # the demo's shape and a larger one, 5 timed rounds
    python benchmarks/bench_compile.py --quick         # the demo's shape only, 2 timed rounds (make bench)
    python benchmarks/bench_compile.py --shapes demo --repeats 10

One step = forward + loss (recurlen.training.compile.CompiledForward around what RecurlenModule runs: forward_hidden
and lit_module.head_token_loss) + backward + AdamW, float32. Two copies of one model (same weights): one eager, one
compiled. The compiled copy's first step includes compiling the forward and the backward (torch.compile with
inductor, C++ code on CPU): that time is reported on its own, with a second step, which may compile again. Then
rounds of one step each, the order rotated every round (A B, B A, ...), wall time and process CPU time; the losses
of the first step are checked equal.

Shapes:
  demo     the Mamba-2 demo's post-training: the tiny model with chunks of 32 (experiments/model/mamba2/tiny-slow.yaml),
           64 lanes x 32 tokens;
  larger   the same model at 8 lanes x 512 tokens (bench_train_step.py's tiny shape).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time

import _common
import torch

from recurlen import Mamba2LM, preset
from recurlen.training.compile import CompiledForward
from recurlen.training.lit_module import head_token_loss

SHAPES = {"demo": (64, 32), "larger": (8, 512)}


def make_step(model: Mamba2LM, ids: torch.Tensor, *, compiled: bool):
    def forward_loss(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        hidden, _ = model.forward_hidden(inputs)
        return head_token_loss(model, hidden, targets, None)

    fn = CompiledForward(forward_loss, what="Mamba2LM") if compiled else forward_loss
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> tuple[float, float, float]:
        cpu, start = time.process_time(), time.perf_counter()
        loss = fn(ids[:, :-1], ids[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        step.losses.append(float(loss.detach()))
        return time.perf_counter() - start, 0.0, time.process_time() - cpu

    step.fn, step.losses = fn, []
    return step


def bench_shape(name: str, args: argparse.Namespace) -> dict:
    batch, length = SHAPES[name]
    torch.manual_seed(0)
    eager_model = Mamba2LM(preset("tiny", chunk_size=32, A_init_range=(0.001, 0.1), A_init_log_uniform=True))
    compiled_model = copy.deepcopy(eager_model)
    ids = torch.randint(0, eager_model.config.vocab_size, (batch, length + 1),
                        generator=torch.Generator().manual_seed(1))
    steps = {"eager": make_step(eager_model, ids, compiled=False), "compiled": make_step(compiled_model, ids,
                                                                                       compiled=True)}
    eager_first = steps["eager"]()
    compile_first = steps["compiled"]()
    compile_second = steps["compiled"]()
    if steps["compiled"].fn.failure:
        raise SystemExit(f"torch.compile failed: {steps['compiled'].fn.failure}")
    # The first step of each: the same weights and batch, so the same loss up to float rounding
    first = steps["eager"].losses[0], steps["compiled"].losses[0]
    print(f"\n== {name}: {batch} x {length} tokens; first-step loss eager {first[0]:.6f}, compiled {first[1]:.6f}")
    if abs(first[0] - first[1]) > 1e-4 * abs(first[0]):
        raise SystemExit(f"compiled and eager losses differ: {first}")
    print(f"compile: first compiled step {compile_first[0]:.1f} s wall / {compile_first[2]:.1f} s CPU, second "
          f"{compile_second[0]:.2f} s wall (eager's first step {eager_first[0]:.2f} s)")
    steps["eager"]()  # eager's second step, so that both have taken two before the timed rounds
    times = _common.run_interleaved(steps, warmup=0, repeats=args.repeats, peak=None)
    row = {}
    for impl, t in times.items():
        row[impl] = {"wall": statistics.median(t.fwd_bwd), "cpu": statistics.median(t.cpu)}
        print(f"{impl:9s} step {1e3 * row[impl]['wall']:8.1f} ms wall [{1e3 * min(t.fwd_bwd):.1f} - "
              f"{1e3 * max(t.fwd_bwd):.1f}], {1e3 * row[impl]['cpu']:8.1f} ms CPU")
    wall = row["eager"]["wall"] / row["compiled"]["wall"]
    cpu = row["eager"]["cpu"] / row["compiled"]["cpu"]
    saved = row["eager"]["wall"] - row["compiled"]["wall"]
    breakeven = compile_first[0] / saved if saved > 0 else float("inf")
    print(f"summary {name}: compiled {wall:.2f}x eager's speed (wall), {cpu:.2f}x (CPU time); compiling took "
          f"{compile_first[0]:.0f} s = {breakeven:.0f} steps of the time it saves per step; load (1 min) "
          f"{_common.load_1min():.2f}")
    _common.record(args.results, benchmark="trainer.compile step", shape=f"mamba2 tiny {batch}x{length}", unit="ms",
                   recurlen=1e3 * row["compiled"]["wall"], peers={"eager": 1e3 * row["eager"]["wall"]},
                   ratios={"eager": wall}, higher_is_better=False, target="")
    return {"speedup_wall": wall, "speedup_cpu": cpu, "compile_s": compile_first[0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the demo's shape, 2 timed rounds (make bench)")
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=None)
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds (default 5, quick 2)")
    parser.add_argument("--threads", type=int, default=None)
    _common.add_results_option(parser)
    args = parser.parse_args()
    args.shapes = args.shapes or (["demo"] if args.quick else list(SHAPES))
    args.repeats = args.repeats or (2 if args.quick else 5)
    threads = _common.set_threads(args.threads)
    _common.print_environment("trainer.compile: torch.compile vs eager, training step", threads)
    for name in args.shapes:
        bench_shape(name, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
