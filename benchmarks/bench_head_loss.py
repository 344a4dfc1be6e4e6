"""The LM head's loss in chunks (recurlen.models.head_loss) against the plain logits + cross-entropy, same run.

    python benchmarks/bench_head_loss.py              # 130m-like head, 2 x 1024 positions, 5 timed rounds
    python benchmarks/bench_head_loss.py --quick      # 1 x 1024 positions, 2 timed rounds (make bench)
    python benchmarks/bench_head_loss.py --batch 4 --length 2048 --repeats 3

One step = the head's logits, the token-mean cross-entropy and the backward to the hidden states and the head's
weight (float32, as on CPU), at the 130m shape's head: d_model 768, 50277 scored rows of a 50288-row padded head.
Side by side in one process, the same inputs:
  plain     token_loss(model.logits_from_hidden(hidden), targets), what training computed before;
  chunked   chunked_token_loss: 64 MiB of float32 logits at a time, gradients made in the same pass.
Peak memory: the bytes of tensor storages alive at once during one step (bench_memory.TensorPeak: every op's
outputs counted until they are freed; the inputs and the weight are not counted), measured for each path in this
run. Time: the median of interleaved rounds (A B, B A, ...). The loss and the gradients are checked equal first.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import _common
import torch
from bench_memory import TensorPeak

from recurlen import preset
from recurlen.models.head_loss import chunk_positions, chunked_token_loss
from recurlen.models.mamba2.model import Mamba2LM
from recurlen.training.lit_module import token_loss


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 x 1024 positions, 2 timed rounds (make bench)")
    parser.add_argument("--batch", type=int, default=None, help="lanes (default 2, quick 1)")
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds (default 5, quick 2)")
    parser.add_argument("--threads", type=int, default=None)
    _common.add_results_option(parser)
    args = parser.parse_args()
    batch = args.batch or (1 if args.quick else 2)
    repeats = args.repeats or (2 if args.quick else 5)
    _common.print_environment("LM head loss: chunked vs plain (130m head)", _common.set_threads(args.threads))

    with torch.device("meta"):  # only the head is used: its weight is made for real below
        model = Mamba2LM(preset("130m", n_layer=1))
    cfg = model.config
    g = torch.Generator().manual_seed(0)
    model.backbone.embedding.weight = torch.nn.Parameter(torch.randn(cfg.padded_vocab_size, cfg.d_model, generator=g)
                                                         * 0.02)
    model.lm_head.weight = model.backbone.embedding.weight
    hidden = torch.randn(batch, args.length, cfg.d_model, generator=g, requires_grad=True)
    targets = torch.randint(0, cfg.vocab_size, (batch, args.length), generator=g)
    positions = batch * args.length
    print(f"# head {cfg.padded_vocab_size} x {cfg.d_model} ({model.head_rows} scored), {batch} x {args.length} "
          f"positions: float32 logits {positions * model.head_rows * 4 / 2**20:.0f} MiB; chunks of "
          f"{chunk_positions(model.head_rows)} positions")

    paths = {"plain": lambda: token_loss(model.logits_from_hidden(hidden), targets, None),
             "chunked": lambda: chunked_token_loss(model, hidden, targets, None)}

    def run(path: str) -> tuple[torch.Tensor, list[torch.Tensor]]:
        hidden.grad = model.lm_head.weight.grad = None
        loss = paths[path]()
        loss.backward()
        return loss.detach(), [hidden.grad, model.lm_head.weight.grad]

    (ref, ref_grads), (got, grads) = run("plain"), run("chunked")
    worst = max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(grads, ref_grads))
    print(f"same function: loss {float(got):.7f} vs {float(ref):.7f}; worst max|grad diff| / max|grad| {worst:.1e}")
    if abs(float(got - ref)) > 1e-5 * abs(float(ref)) or worst > 1e-4:
        print("MISMATCH", file=sys.stderr)
        return 1

    peaks = {}
    for path in paths:
        hidden.grad = model.lm_head.weight.grad = None
        with TensorPeak([hidden, model.lm_head.weight, targets]) as peak:
            run(path)
        peaks[path] = peak.peak

    def timed_step(path: str):
        def step() -> tuple[float, float, float]:
            return _common.timed(lambda: run(path)), 0.0, 0.0
        return step

    times = _common.run_interleaved({p: timed_step(p) for p in paths}, warmup=1, repeats=repeats, peak=None)
    ms = {p: 1e3 * statistics.median(t.fwd_bwd) for p, t in times.items()}
    for p in paths:
        print(f"{p:8s} step {ms[p]:8.1f} ms [{1e3 * min(times[p].fwd_bwd):.1f} - {1e3 * max(times[p].fwd_bwd):.1f}]"
              f"   peak tensors {peaks[p] / 2**20:8.1f} MiB")
    print(f"summary: chunked / plain peak memory {peaks['chunked'] / peaks['plain']:.3f}x "
          f"({peaks['plain'] / 2**20:.0f} -> {peaks['chunked'] / 2**20:.0f} MiB), "
          f"time {ms['chunked'] / ms['plain']:.3f}x; load average (1 min) {_common.load_1min():.2f}")
    shape = f"130m head {batch}x{args.length}"
    _common.record(args.results, benchmark="LM head loss peak memory", shape=shape, unit="MiB",
                   recurlen=peaks["chunked"] / 2**20, peers={"plain": peaks["plain"] / 2**20},
                   ratios={"plain": peaks["chunked"] / peaks["plain"]}, higher_is_better=False, target="")
    _common.record(args.results, benchmark="LM head loss time", shape=shape, unit="ms", recurlen=ms["chunked"],
                   peers={"plain": ms["plain"]}, ratios={"plain": ms["chunked"] / ms["plain"]},
                   higher_is_better=False, target="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
