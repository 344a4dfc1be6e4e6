"""Train-loader throughput, and the share of a CPU training step spent waiting for data (target < 2%).

    python benchmarks/bench_dataloader.py [--shapes 64x32,16x256] [--workers 0,1] [--steps 30]

For each batch x seq_len shape and worker count it prints, side by side:
    loader tok/s   tokens per second the train loader yields when nothing else runs
    step ms        one training step of Mamba2LM(preset("tiny")): forward, cross-entropy backward, AdamW
    fetch ms       time to get the next batch from the loader inside that training loop
    wait %         fetch / (fetch + step): the share of the loop spent waiting for data
The corpus is the embedded default (built into --cache-dir on first use).
"""

from __future__ import annotations

import argparse
import logging
import time
from itertools import islice

import _common
import torch
import torch.nn.functional as F

import recurlen
from recurlen.training.data import DataConfig, RecurlenDataModule


def loader_tokens_per_s(dm: RecurlenDataModule, steps: int) -> float:
    loader = iter(dm.train_dataloader(start_step=0, num_steps=steps + 2))
    next(loader), next(loader)  # worker start-up is not throughput
    start = time.perf_counter()
    batches = list(islice(loader, steps))
    elapsed = time.perf_counter() - start
    return sum(b["input_ids"].numel() for b in batches) / elapsed


def train_loop(dm: RecurlenDataModule, steps: int, warmup: int = 3) -> tuple[float, float]:
    """(mean step seconds, mean fetch seconds) over `steps` training steps after `warmup` ones."""
    torch.manual_seed(0)
    model = recurlen.Mamba2LM(recurlen.preset("tiny"))
    dm.check_model_vocab(model.config.vocab_size)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = iter(dm.train_dataloader(start_step=0, num_steps=steps + warmup))
    fetch = compute = 0.0
    for i in range(steps + warmup):
        t0 = time.perf_counter()
        batch = next(loader)
        t1 = time.perf_counter()
        logits, _state = model(batch["input_ids"])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), batch["targets"].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t2 = time.perf_counter()
        if i >= warmup:
            fetch, compute = fetch + (t1 - t0), compute + (t2 - t1)
    return compute / steps, fetch / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="64x32,16x256", help="comma-separated BATCHxSEQ_LEN")
    parser.add_argument("--workers", default="0,1", help="comma-separated DataLoader worker counts")
    parser.add_argument("--layout", default="contiguous", choices=["contiguous", "independent"])
    parser.add_argument("--steps", type=int, default=20, help="timed training steps per configuration")
    parser.add_argument("--loader-steps", type=int, default=500, help="batches timed for loader throughput")
    parser.add_argument("--cache-dir", default=None, help="token cache (default $RECURLEN_CACHE or ~/.cache/recurlen)")
    parser.add_argument("--quick", action="store_true", help="one shape, workers 0, fewer steps (make bench)")
    _common.add_results_option(parser)
    args = parser.parse_args()
    if args.quick:
        args.shapes, args.workers, args.steps, args.loader_steps = "64x32", "0", 8, 100
    logging.basicConfig(level=logging.WARNING)

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, layout={args.layout}")
    print(f"{'shape':>10} {'workers':>7} {'loader tok/s':>13} {'step ms':>8} {'fetch ms':>9} {'wait %':>7}")
    for shape in args.shapes.split(","):
        batch, seq_len = (int(x) for x in shape.lower().split("x"))
        for workers in (int(w) for w in args.workers.split(",")):
            cfg = DataConfig(seq_len=seq_len, batch_size=batch, layout=args.layout, num_workers=workers,
                             cache_dir=args.cache_dir, val_sequences=0, val_segments=0)
            dm = RecurlenDataModule(cfg)
            dm.setup()
            tok_s = loader_tokens_per_s(dm, args.loader_steps)
            step_s, fetch_s = train_loop(dm, args.steps)
            share = fetch_s / (fetch_s + step_s)
            print(f"{shape:>10} {workers:>7} {tok_s:>13,.0f} {step_s * 1e3:>8.1f} {fetch_s * 1e3:>9.3f} "
                  f"{share:>7.2%}")
            _common.record(args.results, benchmark=f"data wait share ({workers} workers)", shape=f"tiny {shape}",
                           unit="ms fetch", recurlen=fetch_s * 1e3, peers={"step ms": step_s * 1e3},
                           ratios={"of the loop": share}, higher_is_better=False, target="< 0.02 (2%)")


if __name__ == "__main__":
    main()
