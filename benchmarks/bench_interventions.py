"""Step time of each intervention against `none` on the same shapes (target: state passing / TBTT <= +3%).

    python benchmarks/bench_interventions.py [--quick] [--model tiny] [--batch 64] [--seq-len 32] [--threads 1]

Each step is the LightningModule's real training_step (initial state from the intervention, forward,
loss, carried state kept) + backward + AdamW step, on batches from the real DataModule. The
interventions are timed interleaved, round-robin, so drift in machine load hits all of them alike.
"""

from __future__ import annotations

import argparse
import statistics
import time

import _common
import torch

from recurlen import Mamba2LM, preset
from recurlen.training.data import DataConfig, RecurlenDataModule
from recurlen.training.interventions import INTERVENTIONS, LAYOUT_FOR, InterventionConfig
from recurlen.training.lit_module import RecurlenModule
from recurlen.training.optim import OptimConfig, build_optimizer


def make(name: str, args, fitted) -> tuple[RecurlenModule, RecurlenDataModule, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = Mamba2LM(preset(args.model, chunk_size=args.seq_len), backend="torch")
    module = RecurlenModule(model, intervention=InterventionConfig(name=name), optim=OptimConfig(), seed=0,
                            train_seq_len=args.seq_len, tokenizer="bytes", total_steps=10_000)
    if name == "fitted_noise":
        module.intervention.set_stats(fitted)
    dm = RecurlenDataModule(DataConfig(seq_len=args.seq_len, batch_size=args.batch, layout=LAYOUT_FOR[name],
                                       val_sequences=0, val_segments=0))
    dm.setup("fit")
    opt, _ = build_optimizer(model, OptimConfig(), total_steps=10_000)
    return module, dm, opt


def step(module: RecurlenModule, opt, batch) -> float:
    t0 = time.perf_counter()
    loss = module.training_step(batch, 0)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true")
    _common.add_results_option(parser)
    args = parser.parse_args()
    if args.quick:
        args.steps, args.warmup = 15, 3
    torch.set_num_threads(args.threads)
    # self.log is a no-op outside a Trainer, which is what we want to time: the intervention's own cost.
    RecurlenModule.log = lambda *a, **k: None

    from recurlen.training.interventions import FittedNoiseStats

    cfg = preset(args.model)
    fitted = FittedNoiseStats(torch.zeros(cfg.n_layer, cfg.nheads), torch.ones(cfg.n_layer, cfg.nheads) * 0.1)
    runs = {name: make(name, args, fitted) for name in INTERVENTIONS}
    times: dict[str, list[float]] = {name: [] for name in INTERVENTIONS}
    for k in range(args.warmup + args.steps):
        for name, (module, dm, opt) in runs.items():
            dt = step(module, opt, dm.train_batch(k))
            if k >= args.warmup:
                times[name].append(dt)
    base = statistics.median(times["none"])
    print(f"model={args.model} batch={args.batch} seq_len={args.seq_len} threads={args.threads} "
          f"steps={args.steps} (median of interleaved steps)")
    print(f"{'intervention':>14s} {'ms/step':>9s} {'vs none':>9s}")
    for name in INTERVENTIONS:
        med = statistics.median(times[name])
        print(f"{name:>14s} {med * 1e3:9.2f} {100 * (med / base - 1):+8.1f}%")
        if name != "none":
            _common.record(args.results, benchmark=f"step time, {name}", shape=f"{args.model} {args.batch}x"
                           f"{args.seq_len}", unit="ms", recurlen=med * 1e3, peers={"none": base * 1e3},
                           ratios={"none": med / base}, higher_is_better=False,
                           target="<= 1.03x" if name in ("state_passing", "tbptt") else "")


if __name__ == "__main__":
    main()
