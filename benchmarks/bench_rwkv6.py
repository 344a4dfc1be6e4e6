"""RWKV-6 training step on CPU: achieved model FLOP/s as a fraction of the measured float32 matmul peak, and the
WKV scan against fla's pure-PyTorch chunked reference (the one CPU peer there is).

    python benchmarks/bench_rwkv6.py                   # the small shape, batch 4 x 512
    python benchmarks/bench_rwkv6.py --quick           # tiny shape, fewer steps
    python benchmarks/bench_rwkv6.py --shapes small --length 1024 --threads 2

One step = forward + next-token cross-entropy + backward + AdamW (fused) step, float32, backend='torch'.
The peak is the fastest float32 (size x size) matmul, measured before the model, between every timed step and
after it; "% of peak" divides by the largest of them (a cold or loaded measurement only comes out lower).
fla's whole RWKV-6 layer needs Triton; its `naive_chunk_rwkv6` (fla-core; no state in or out, and its in-place
updates leave no backward) is a pure-PyTorch WKV peer: both scans are timed forward only on the same inputs,
interleaved.

Model FLOPs per token (training = 3 x forward):
  dense = 6 x (every projection, low-rank mixer and channel-mix weight, plus the LM head; the embedding lookup,
          norms, token shifts and elementwise ops are not counted)
  wkv   = 3 x layers x heads x (2 l Dk + 2 l Dv + 2 SUB Dk + 4 Dk Dv) at chunk length l: the chunk's scores and
          their use, the diagonal sub-blocks, chunk states and state reads (as GLA's benchmark counts them).
"""

from __future__ import annotations

import argparse
import statistics

import _common
import torch
from bench_train_step import Timing, make_train_step

from recurlen.models.rwkv6 import RWKV6LM, preset
from recurlen.models.rwkv6.scan import SUB, wkv6_chunked

SHAPES = {
    # name: (config, batch, length)
    "tiny": (lambda: preset("tiny"), 8, 512),
    "small": (lambda: preset("tiny", hidden_size=512, num_hidden_layers=4, num_heads=8, intermediate_size=1792,
                                  proj_low_rank_dim=32, gate_low_rank_dim=64, vocab_size=8192), 4, 512),
}


class Peak:
    """The float32 matmul peak, measured whenever asked (before, between steps, after); the largest is the
    denominator."""

    def __init__(self, size: int) -> None:
        self.size, self.samples = size, []
        self.a, self.b, self.out = torch.randn(size, size), torch.randn(size, size), torch.empty(size, size)

    def measure(self, repeats: int = 2) -> None:
        torch.matmul(self.a, self.b, out=self.out)
        best = min(_common.timed(lambda: torch.matmul(self.a, self.b, out=self.out)) for _ in range(repeats))
        self.samples.append(2.0 * self.size**3 / best)

    @property
    def max(self) -> float:
        return max(self.samples)


def train_flops_per_token(model: RWKV6LM) -> tuple[float, float]:
    cfg = model.config
    dense = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2 and "embeddings" not in n
                and "x_bias" not in n and "bonus" not in n)
    l, h, dk, dv = cfg.chunk_size, cfg.num_heads, cfg.head_dim, cfg.head_v_dim
    wkv = 3.0 * cfg.num_hidden_layers * h * (2 * l * dk + 2 * l * dv + 2 * SUB * dk + 4 * dk * dv)
    return 6.0 * dense, wkv


def bench_shape(name: str, args: argparse.Namespace, peak: Peak) -> float:
    make_cfg, batch, length = SHAPES[name]
    cfg = make_cfg()
    batch, length = args.batch or batch, args.length or length
    torch.manual_seed(args.seed)
    model = RWKV6LM(cfg, backend="torch")
    dense, wkv = train_flops_per_token(model)
    print(f"\n== {name}: hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers, {cfg.num_heads} heads of "
          f"{cfg.head_dim} x {cfg.head_v_dim}, channel mix {cfg.ffn_size}, vocab {cfg.vocab_size}, chunk "
          f"{cfg.chunk_size}; {model.num_parameters() / 1e6:.1f} M params; batch {batch} x length {length}")
    print(f"model FLOPs/token: {_common.fmt_si(dense)} dense + {_common.fmt_si(wkv)} WKV")
    ids = torch.randint(0, cfg.vocab_size, (batch, length), generator=torch.Generator().manual_seed(args.seed + 1))
    step = make_train_step(lambda x: model(x)[0], model.parameters(), ids, cfg.vocab_size, adamw="fused")
    for _ in range(args.warmup):
        step()
    t = Timing()
    for _ in range(args.repeats):
        fwd_bwd, opt, cpu = step()
        t.fwd_bwd.append(fwd_bwd)
        t.opt.append(opt)
        t.cpu.append(cpu)
        peak.measure()
    seconds = statistics.median(t.steps)
    flops = (dense + wkv) * batch * length / seconds
    fraction = flops / peak.max
    print(f"step {seconds * 1e3:.0f} ms [{min(t.steps) * 1e3:.0f} - {max(t.steps) * 1e3:.0f}], fwd+bwd "
          f"{statistics.median(t.fwd_bwd) * 1e3:.0f} ms, AdamW {statistics.median(t.opt) * 1e3:.0f} ms; "
          f"{batch * length / seconds:.1f} tokens/s; {flops / 1e9:.1f} GFLOP/s = {fraction:.1%} of peak")
    return fraction


def bench_scan_peer(args: argparse.Namespace, peak: Peak) -> float | None:
    """recurlen's WKV scan vs fla's naive_chunk_rwkv6, forward only, interleaved; None without fla-core."""
    try:
        from fla.ops.rwkv6.chunk_naive import naive_chunk_rwkv6
    except Exception as err:  # fla-core is optional (make test-kernels installs it)
        print(f"\n(no WKV peer: fla-core does not import: {type(err).__name__})")
        return None
    batch, length, heads, dk = 4, 512, 8, 64
    gen = torch.Generator().manual_seed(args.seed)
    r, k, v = (torch.randn(batch, length, heads, dk, generator=gen) * 0.5 for _ in range(3))
    w = -torch.exp(torch.randn(batch, length, heads, dk, generator=gen) - 2.0)  # mild decays: fla's naive form
    u = torch.randn(heads, dk, generator=gen)                                     # overflows with strong ones
    inputs = [r, k, v, w, u]

    @torch.no_grad()
    def ours():
        return wkv6_chunked(*inputs, chunk_size=64)[0]

    @torch.no_grad()
    def theirs():
        return naive_chunk_rwkv6(*(t.transpose(1, 2) for t in inputs[:4]), inputs[4], chunk_size=32).transpose(1, 2)

    got, ref = ours(), theirs()
    err = float((got - ref).abs().max() / ref.abs().max())
    times = {"recurlen": [], "fla naive": []}
    for fn in (ours, theirs):
        fn()
    for _ in range(args.repeats):
        for label, fn in (("recurlen", ours), ("fla naive", theirs)):
            times[label].append(_common.timed(fn))
        peak.measure()
    ratio = statistics.median(times["fla naive"]) / statistics.median(times["recurlen"])
    print(f"\n== WKV scan, forward, batch {batch} x {length}, {heads} heads of {dk}: recurlen "
          f"{statistics.median(times['recurlen']) * 1e3:.0f} ms, fla's naive_chunk_rwkv6 "
          f"{statistics.median(times['fla naive']) * 1e3:.0f} ms: {ratio:.2f}x (outputs agree to {err:.1e})")
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny shape, 1 warm-up + 2 timed steps")
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), help="shapes to run (default: small)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=None, help="timed steps (default 3, quick 2)")
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--length", type=int, default=None)
    parser.add_argument("--peak-size", type=int, default=2048, help="matmul size for the float32 peak")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.shapes = args.shapes or (["tiny"] if args.quick else ["small"])
    args.repeats = args.repeats or (2 if args.quick else 3)
    threads = _common.set_threads(args.threads)
    _common.print_environment("RWKV-6 training step (backend='torch'): fraction of the float32 matmul peak", threads)
    peak = Peak(args.peak_size)
    peak.measure(5)
    results = {name: bench_shape(name, args, peak) for name in args.shapes}
    ratio = bench_scan_peer(args, peak)
    peak.measure(5)
    samples = ", ".join(f"{s / 1e9:.1f}" for s in peak.samples)
    print(f"\nfloat32 matmul peak ({args.peak_size}^3) before / between / after, GFLOP/s: {samples}; "
          f"fractions use the largest, {peak.max / 1e9:.1f}")
    print("summary: " + ", ".join(f"{n} {f:.1%} of peak" for n, f in results.items())
          + ("" if ratio is None else f"; WKV scan {ratio:.2f}x fla's naive chunked reference"))
    print(f"# load average at end: {_common.load_average()}")


if __name__ == "__main__":
    main()
