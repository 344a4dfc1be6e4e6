"""RWKV-6 training step on CPU: achieved model FLOP/s as a fraction of the measured float32 matmul peak, and the
WKV scan against fla's pure-PyTorch chunked reference (the one CPU peer there is).

    python benchmarks/bench_rwkv6.py                   # the small shape, batch 4 x 512
    python benchmarks/bench_rwkv6.py --quick           # tiny shape, fewer steps
    python benchmarks/bench_rwkv6.py --shapes small --length 1024 --threads 2

One step = forward + next-token cross-entropy + backward + AdamW (fused) step, float32, backend='torch'.
The peak is the fastest float32 (size x size) matmul, measured before the model, between every timed step and
after it; "% of peak" divides by the largest of them (_common.MatmulPeak says why).
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

from recurlen.models.rwkv6 import RWKV6LM, preset
from recurlen.models.rwkv6.scan import SUB, wkv6_chunked

SHAPES = {
    # name: (config, batch, length)
    "tiny": (lambda: preset("tiny"), 8, 512),
    "small": (lambda: preset("tiny", hidden_size=512, num_hidden_layers=4, num_heads=8, intermediate_size=1792,
                                  proj_low_rank_dim=32, gate_low_rank_dim=64, vocab_size=8192), 4, 512),
}


def train_flops_per_token(model: RWKV6LM) -> tuple[float, float]:
    cfg = model.config
    dense = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2 and "embeddings" not in n
                and "x_bias" not in n and "bonus" not in n)
    l, h, dk, dv = cfg.chunk_size, cfg.num_heads, cfg.head_dim, cfg.head_v_dim
    wkv = 3.0 * cfg.num_hidden_layers * h * (2 * l * dk + 2 * l * dv + 2 * SUB * dk + 4 * dk * dv)
    return 6.0 * dense, wkv


def bench_shape(name: str, args: argparse.Namespace, peak: _common.MatmulPeak) -> dict:
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
    r = _common.time_lm_step(model, vocab=cfg.vocab_size, batch=batch, length=length, flops_per_token=dense + wkv,
                             args=args, peak=peak)
    return {"shape": f"{name} {batch}x{length}", **r}


def bench_scan_peer(args: argparse.Namespace, peak: _common.MatmulPeak) -> dict | None:
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
        peak.between()
    ratio = statistics.median(times["fla naive"]) / statistics.median(times["recurlen"])
    print(f"\n== WKV scan, forward, batch {batch} x {length}, {heads} heads of {dk}: recurlen "
          f"{statistics.median(times['recurlen']) * 1e3:.0f} ms, fla's naive_chunk_rwkv6 "
          f"{statistics.median(times['fla naive']) * 1e3:.0f} ms: {ratio:.2f}x (outputs agree to {err:.1e})")
    return {"shape": f"{batch}x{length}, {heads} heads of {dk}", "ratio": ratio,
            "ms": {label: statistics.median(t) * 1e3 for label, t in times.items()}}


def main() -> None:
    parser = _common.lm_peak_parser(__doc__, SHAPES, default="small", quick="the tiny shape")
    args = parser.parse_args()
    peak = _common.start_lm_peak(args, "RWKV-6 training step (backend='torch'): fraction of the float32 matmul peak",
                                 default=["small"], quick=["tiny"])
    results = {name: bench_shape(name, args, peak) for name in args.shapes}
    scan = bench_scan_peer(args, peak)
    peak.measure("after")
    _common.report_lm_shapes(results, peak, benchmark="RWKV-6 train step", path=args.results)
    if scan is not None:
        print(f"summary WKV scan: {scan['ratio']:.2f}x fla's naive chunked reference (forward)")
        _common.record(args.results, benchmark="RWKV-6 WKV scan, forward", shape=scan["shape"], unit="ms",
                       recurlen=scan["ms"]["recurlen"], peers={"fla naive_chunk_rwkv6": scan["ms"]["fla naive"]},
                       ratios={"fla naive_chunk_rwkv6": scan["ratio"]}, higher_is_better=False)
    print(f"# load average at end: {_common.load_average()}")


if __name__ == "__main__":
    main()
