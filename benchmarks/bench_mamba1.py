"""Mamba-1 training step: recurlen's CPU path against transformers' MambaForCausalLM, same run.

    python benchmarks/bench_mamba1.py                  # tiny and 130m shapes
    python benchmarks/bench_mamba1.py --quick          # tiny shape, short sequence, fewer steps
    python benchmarks/bench_mamba1.py --shapes 130m --threads 2 --repeats 5

One step = forward + next-token cross-entropy + backward + AdamW (fused) step, float32, on the same
token batch with the same weights. The peer is transformers' `MambaForCausalLM` on its pure-PyTorch
path (no mamba-ssm / causal-conv1d: its selective scan is a Python loop over time through autograd,
every step's decays and inputs materialised as (batch, d_inner, length, d_state) tensors). Before
timing, recurlen's weights are copied into the peer and the logits must agree. The models' steps
alternate (A B, B A, ...) so that drift in machine load hits both alike; medians are reported.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import _common
import torch
from bench_train_step import Timing, make_train_step

from recurlen.models.mamba1 import Mamba1LM, preset

SHAPES = {
    # name: (config, batch, length, quick length, target ratio recurlen / transformers)
    "tiny": (lambda: preset("tiny", n_layer=4), 8, 512, 128, 1.5),
    "130m": (lambda: preset("130m"), 1, 512, 128, 1.5),
}
LOGITS_TOL = 1e-4


def transformers_peer(model: Mamba1LM) -> torch.nn.Module:
    """transformers' MambaForCausalLM of the same shape holding a copy of `model`'s weights."""
    from transformers import MambaConfig, MambaForCausalLM

    cfg = model.config
    peer = MambaForCausalLM(MambaConfig(
        vocab_size=cfg.padded_vocab_size, hidden_size=cfg.d_model, state_size=cfg.d_state,
        num_hidden_layers=cfg.n_layer, layer_norm_epsilon=cfg.norm_eps, expand=cfg.expand, conv_kernel=cfg.d_conv,
        use_bias=cfg.bias, use_conv_bias=cfg.conv_bias, time_step_rank=cfg.dt_rank,
        residual_in_fp32=cfg.residual_in_fp32, tie_word_embeddings=cfg.tie_embeddings))
    # Same names except the embedding: the official `embedding`, transformers' `embeddings`.
    weights = {k.replace("backbone.embedding.", "backbone.embeddings."): v for k, v in model.state_dict().items()}
    missing, unexpected = peer.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"weight mapping recurlen -> transformers is incomplete: missing {missing}, "
                           f"unexpected {unexpected}")
    return peer


def bench_shape(name: str, args: argparse.Namespace) -> tuple[float, bool]:
    make_cfg, batch, length, quick_length, target = SHAPES[name]
    cfg = make_cfg()
    length = args.length or (quick_length if args.quick else length)
    batch = args.batch or batch
    print(f"\n== {name}: d_model {cfg.d_model}, {cfg.n_layer} layers, d_state {cfg.d_state}, d_inner {cfg.d_inner}, "
          f"dt_rank {cfg.dt_rank}, scan chunk {cfg.chunk_size}; batch {batch} x length {length}")
    torch.manual_seed(args.seed)
    model = Mamba1LM(cfg, backend="torch")
    peer = transformers_peer(model)
    vocab = cfg.vocab_size
    ids = torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(args.seed + 1))
    check = ids[:2, :min(length, 96)]
    with torch.no_grad():
        diff = (model(check)[0] - peer(check, use_cache=False).logits[..., :vocab]).abs().max().item()
    same = diff <= LOGITS_TOL
    print(f"same function: max|logits diff| {diff:.2e} [{'OK' if same else 'MISMATCH'}, tol {LOGITS_TOL:.0e}]")

    impls = {
        "recurlen": make_train_step(lambda x: model(x)[0], model.parameters(), ids, vocab, adamw="fused"),
        "transformers": make_train_step(lambda x: peer(x, use_cache=False).logits, peer.parameters(), ids, vocab,
                                        adamw="fused"),
    }
    order = list(impls)
    for _ in range(args.warmup):
        for impl in order:
            impls[impl]()
    times = {impl: Timing() for impl in impls}
    for r in range(args.repeats):
        for impl in order if r % 2 == 0 else order[::-1]:
            fwd_bwd, opt, cpu = impls[impl]()
            times[impl].fwd_bwd.append(fwd_bwd)
            times[impl].opt.append(opt)
            times[impl].cpu.append(cpu)
    print(f"{'':<13} {'step ms':>9} {'[min - max]':>19} {'fwd+bwd ms':>11} {'cpu ms':>9} {'tokens/s':>9}")
    tok_s = {}
    for impl, t in times.items():
        step = statistics.median(t.steps)
        tok_s[impl] = batch * length / step
        print(f"{impl:<13} {step * 1e3:>9.0f} {f'[{min(t.steps) * 1e3:.0f} - {max(t.steps) * 1e3:.0f}]':>19} "
              f"{statistics.median(t.fwd_bwd) * 1e3:>11.0f} {statistics.median(t.cpu) * 1e3:>9.0f} {tok_s[impl]:>9.1f}")
    ratio = tok_s["recurlen"] / tok_s["transformers"]
    print(f"ratio recurlen / transformers: {ratio:.2f}x per step (target >= {target:g}x: "
          f"{'met' if ratio >= target else 'MISSED'})")
    return ratio, same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny shape, length 128, 1 warm-up + 3 timed steps")
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), help="shapes to run (default: all)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps per model (default 1)")
    parser.add_argument("--repeats", type=int, default=None, help="timed steps per model (default 5, quick 3)")
    parser.add_argument("--batch", type=int, default=None, help="override the batch size of every shape")
    parser.add_argument("--length", type=int, default=None, help="override the sequence length of every shape")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.shapes = args.shapes or (["tiny"] if args.quick else list(SHAPES))
    args.warmup = 1 if args.warmup is None else args.warmup
    args.repeats = args.repeats or (3 if args.quick else 5)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    threads = _common.set_threads(args.threads)
    _common.print_environment("Mamba-1 training step: recurlen (backend='torch') vs transformers MambaForCausalLM",
                              threads)
    print(f"# transformers {transformers.__version__}")
    results = {name: bench_shape(name, args) for name in args.shapes}
    print("summary: " + ", ".join(f"{n} {r:.2f}x (target {SHAPES[n][4]:g}x)" for n, (r, _) in results.items()))
    print(f"# load average at end: {_common.load_average()}")
    if not all(same for _, same in results.values()):
        sys.exit("the two models are not the same function: the timings compare different models")


if __name__ == "__main__":
    main()
