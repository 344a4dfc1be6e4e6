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

import _common
import torch

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
    r = _common.time_lm_step(model, vocab=cfg.vocab_size, batch=batch, length=length, flops_per_token=dense + gla,
                             args=args, peak=peak)
    return {"shape": f"{name} {batch}x{length}", **r, "target": target}


def main() -> None:
    parser = _common.lm_peak_parser(__doc__, SHAPES, default="340m", quick="both shapes")
    args = parser.parse_args()
    peak = _common.start_lm_peak(args, "GLA training step (backend='torch'): fraction of the float32 matmul peak",
                                 default=["340m"], quick=list(SHAPES))
    results = {name: bench_shape(name, args, peak) for name in args.shapes}
    peak.measure("after")
    _common.report_lm_shapes(results, peak, benchmark="GLA train step", path=args.results)
    print(f"# load average at end: {_common.load_average()}")


if __name__ == "__main__":
    main()
