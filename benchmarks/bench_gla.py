"""GLA training step on CPU: achieved model FLOP/s as a fraction of the measured float32 matmul peak.

    python benchmarks/bench_gla.py                     # the 340m shape (fla-hub/gla-340M), batch 1 x 512
    python benchmarks/bench_gla.py --quick             # tiny and 340m shapes, fewer steps (make bench)
    python benchmarks/bench_gla.py --shapes 340m --length 1024 --threads 2

One step = forward + next-token cross-entropy + backward + AdamW (fused) step, float32, backend='torch'.
There is no pure-PyTorch GLA peer to race (fla's layers need Triton), so the peer is the machine:
the fastest of several float32 (size x size) matmuls, measured in the same process before the model, after
every timed step and after the model; "% of peak" divides by the largest (_common.MatmulPeak says why).

Model FLOPs per token (training = 3 x forward):
  dense = 6 x (every projection and MLP weight, plus the LM head; the embedding lookup, norms and
          elementwise ops are not counted)
  gla   = 3 x layers x heads x (2 l Dk + 2 l Dv + 2 SUB Dk + 4 Dk Dv) at chunk length l:
          the chunk's scores and their use, the diagonal sub-blocks, chunk states and state reads.
"""

from __future__ import annotations

import argparse
import statistics

import _common
import torch
from bench_train_step import make_train_step, run_interleaved

from recurlen.models.gla import GLALM, preset
from recurlen.models.gla.scan import SUB

SHAPES = {
    # name: (config, batch, length, target fraction of peak)
    "tiny": (lambda: preset("tiny"), 8, 512, None),
    "340m": (lambda: preset("340m"), 1, 512, 0.40),
}


def train_flops_per_token(model: GLALM) -> tuple[float, float]:
    cfg = model.config
    dense_weights = sum(p.numel() for n, p in model.named_parameters()
                        if p.dim() == 2 and "embeddings" not in n)
    if cfg.tie_word_embeddings:  # the tied head is the embedding matrix: count it once, as the head
        dense_weights += model.lm_head.weight.numel()
    l, h, dk, dv = cfg.chunk_size, cfg.num_heads, cfg.head_k_dim, cfg.head_v_dim
    gla = 3.0 * cfg.num_hidden_layers * h * (2 * l * dk + 2 * l * dv + 2 * SUB * dk + 4 * dk * dv)
    return 6.0 * dense_weights, gla


def bench_shape(name: str, args: argparse.Namespace, peak: _common.MatmulPeak) -> dict:
    make_cfg, batch, length, target = SHAPES[name]
    cfg = make_cfg()
    batch, length = args.batch or batch, args.length or length
    torch.manual_seed(args.seed)
    model = GLALM(cfg, backend="torch")
    dense, gla = train_flops_per_token(model)
    print(f"\n== {name}: hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers, {cfg.num_heads} heads "
          f"(Dk {cfg.head_k_dim}, Dv {cfg.head_v_dim}), MLP {cfg.mlp_size}, vocab {cfg.vocab_size}, chunk "
          f"{cfg.chunk_size}; {model.num_parameters() / 1e6:.1f} M params; batch {batch} x length {length}")
    print(f"model FLOPs/token: {_common.fmt_si(dense)} dense + {_common.fmt_si(gla)} GLA")
    ids = torch.randint(0, cfg.vocab_size, (batch, length), generator=torch.Generator().manual_seed(args.seed + 1))
    step = make_train_step(lambda x: model(x)[0], model.parameters(), ids, cfg.vocab_size, adamw="fused")
    t = run_interleaved({"recurlen": step}, warmup=args.warmup, repeats=args.repeats, peak=peak)["recurlen"]
    seconds = statistics.median(t.steps)
    flops = (dense + gla) * batch * length / seconds
    print(f"step {seconds * 1e3:.0f} ms [{min(t.steps) * 1e3:.0f} - {max(t.steps) * 1e3:.0f}], fwd+bwd "
          f"{statistics.median(t.fwd_bwd) * 1e3:.0f} ms, AdamW {statistics.median(t.opt) * 1e3:.0f} ms; "
          f"{batch * length / seconds:.1f} tokens/s; {flops / 1e9:.1f} GFLOP/s")
    return {"shape": f"{name} {batch}x{length}", "tok_s": batch * length / seconds, "flops": flops, "target": target}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="both shapes, 1 warm-up + 2 timed steps (make bench)")
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), help="shapes to run (default: 340m)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=None, help="timed steps (default 3, quick 2)")
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--length", type=int, default=None)
    parser.add_argument("--peak-size", type=int, default=2048, help="matmul size for the float32 peak")
    parser.add_argument("--seed", type=int, default=0)
    _common.add_results_option(parser)
    args = parser.parse_args()
    args.shapes = args.shapes or (list(SHAPES) if args.quick else ["340m"])
    args.repeats = args.repeats or (2 if args.quick else 3)
    threads = _common.set_threads(args.threads)
    _common.print_environment("GLA training step (backend='torch'): fraction of the float32 matmul peak", threads)
    peak = _common.MatmulPeak(size=args.peak_size)
    peak.measure("before")
    results = {name: bench_shape(name, args, peak) for name in args.shapes}
    peak.measure("after")
    print("\n" + peak.report())
    for name, r in results.items():
        fraction = r["flops"] / peak.denominator
        first = r["flops"] / (peak.of("before")[0])
        verdict = "" if r["target"] is None else (f" (target >= {r['target']:.0%}: "
                                                   f"{'met' if fraction >= r['target'] else 'MISSED'})")
        print(f"summary {name}: {r['flops'] / 1e9:.1f} GFLOP/s = {fraction:.1%} of the largest peak{verdict}; "
              f"{first:.1%} of the peak measured before the model alone")
        _common.record(args.results, benchmark="GLA train step", shape=r["shape"], unit="tokens/s",
                       recurlen=r["tok_s"], peers={}, ratios={}, higher_is_better=True, pct_of_peak=fraction,
                       target="" if r["target"] is None else f">= {r['target']:.0%} of peak", peak=peak.summary())
    print(f"# load average at end: {_common.load_average()}")


if __name__ == "__main__":
    main()
