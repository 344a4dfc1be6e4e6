"""Mamba-1 training step: recurlen's CPU path against transformers' MambaForCausalLM on both its CPU paths.

    python benchmarks/bench_mamba1.py                  # tiny and 130m shapes
    python benchmarks/bench_mamba1.py --quick          # both shapes, length 128, fewer steps (make bench)
    python benchmarks/bench_mamba1.py --shapes 130m --threads 2 --repeats 5

One step = forward + next-token cross-entropy + backward + AdamW (fused) step, float32, on the same
token batch with the same weights. transformers (5.x) has two CPU paths for Mamba-1, both peers here:
  loop     the default (no mamba-ssm / causal-conv1d kernels): a Python loop over time through autograd,
           every step's decays and inputs materialised as (batch, d_inner, length, d_state) tensors;
  mambapy  `MambaConfig(use_mambapy=True)` with the `mambapy` package: a parallel (Blelloch) scan in
           PyTorch over the same materialised tensors, length padded to a power of two.
(Its third, `use_associative_scan`, only runs inside torch.compile; mamba-ssm's and the Hub's kernels are CUDA
only.) Before timing, recurlen's weights are copied into each peer and the logits must agree. The steps run in
rounds with the order rotated every round, so that drift in machine load hits all alike; medians are
reported, and the ratio that counts is the one against the fastest peer.
"""

from __future__ import annotations

import argparse
import os
import sys

import _common
import torch
from bench_train_step import make_train_step, print_timings, run_interleaved

from recurlen.models.mamba1 import Mamba1LM, preset

SHAPES = {
    # name: (config, batch, length, quick length, target ratio recurlen / transformers)
    "tiny": (lambda: preset("tiny", n_layer=4), 8, 512, 128, 1.5),
    "130m": (lambda: preset("130m"), 1, 512, 128, 1.5),
}
LOGITS_TOL = 1e-4


PEERS = {"loop": False, "mambapy": True}  # peer name -> MambaConfig(use_mambapy=...)


def transformers_peer(model: Mamba1LM, *, use_mambapy: bool) -> torch.nn.Module:
    """transformers' MambaForCausalLM of the same shape holding a copy of `model`'s weights."""
    from transformers import MambaConfig, MambaForCausalLM
    from transformers.utils.import_utils import is_mambapy_available

    if use_mambapy and not is_mambapy_available():
        raise SystemExit("transformers' mambapy path needs the mambapy package: pip install mambapy "
                         "(it is in recurlen's dev extra)")
    cfg = model.config
    peer = MambaForCausalLM(MambaConfig(
        vocab_size=cfg.padded_vocab_size, hidden_size=cfg.d_model, state_size=cfg.d_state,
        num_hidden_layers=cfg.n_layer, layer_norm_epsilon=cfg.norm_eps, expand=cfg.expand, conv_kernel=cfg.d_conv,
        use_bias=cfg.bias, use_conv_bias=cfg.conv_bias, time_step_rank=cfg.dt_rank,
        residual_in_fp32=cfg.residual_in_fp32, tie_word_embeddings=cfg.tie_embeddings, use_mambapy=use_mambapy))
    # Same names except the embedding: the official `embedding`, transformers' `embeddings`.
    weights = {k.replace("backbone.embedding.", "backbone.embeddings."): v for k, v in model.state_dict().items()}
    missing, unexpected = peer.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"weight mapping recurlen -> transformers is incomplete: missing {missing}, "
                           f"unexpected {unexpected}")
    return peer


def bench_shape(name: str, args: argparse.Namespace, peak: _common.MatmulPeak) -> dict:
    make_cfg, batch, length, quick_length, target = SHAPES[name]
    cfg = make_cfg()
    length = args.length or (quick_length if args.quick else length)
    batch = args.batch or batch
    print(f"\n== {name}: d_model {cfg.d_model}, {cfg.n_layer} layers, d_state {cfg.d_state}, d_inner {cfg.d_inner}, "
          f"dt_rank {cfg.dt_rank}, scan chunk {cfg.chunk_size}; batch {batch} x length {length}")
    torch.manual_seed(args.seed)
    model = Mamba1LM(cfg, backend="torch")
    vocab = cfg.vocab_size
    ids = torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(args.seed + 1))
    check = ids[:2, :min(length, 96)]
    impls = {"recurlen": make_train_step(lambda x: model(x)[0], model.parameters(), ids, vocab, adamw="fused")}
    same = True
    for peer_name in args.peers:
        peer = transformers_peer(model, use_mambapy=PEERS[peer_name])
        with torch.no_grad():
            diff = (model(check)[0] - peer(check, use_cache=False).logits[..., :vocab]).abs().max().item()
        same &= diff <= LOGITS_TOL
        print(f"same function (transformers {peer_name}): max|logits diff| {diff:.2e} "
              f"[{'OK' if diff <= LOGITS_TOL else 'MISMATCH'}, tol {LOGITS_TOL:.0e}]")
        impls[f"transformers {peer_name}"] = make_train_step(
            lambda x, peer=peer: peer(x, use_cache=False).logits, peer.parameters(), ids, vocab, adamw="fused")
    times = run_interleaved(impls, warmup=args.warmup, repeats=args.repeats, peak=peak)
    print(f"{args.warmup} warm-up + {args.repeats} timed steps each; medians")
    tok_s = print_timings(times, batch * length)
    ours = tok_s.pop("recurlen")
    ratios = {peer: ours / t for peer, t in tok_s.items()}
    fastest = max(tok_s, key=tok_s.get)
    print("ratio recurlen / transformers: " + ", ".join(f"{r:.2f}x {p}" for p, r in ratios.items())
          + f"; against the fastest ({fastest}) {ratios[fastest]:.2f}x (target >= {target:g}x: "
          f"{'met' if ratios[fastest] >= target else 'MISSED'})")
    return {"shape": f"{name} {batch}x{length}", "recurlen": ours, "peers": tok_s, "ratios": ratios,
            "fastest": fastest, "target": target, "same": same}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="length 128, 1 warm-up + 3 timed steps (make bench)")
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), help="shapes to run (default: all)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps per model (default 1)")
    parser.add_argument("--repeats", type=int, default=None, help="timed steps per model (default 5, quick 3)")
    parser.add_argument("--batch", type=int, default=None, help="override the batch size of every shape")
    parser.add_argument("--length", type=int, default=None, help="override the sequence length of every shape")
    parser.add_argument("--peers", nargs="+", choices=list(PEERS), default=list(PEERS),
                        help="transformers paths to race (default: both)")
    parser.add_argument("--peak-size", type=int, default=2048, help="matmul size for the float32 peak")
    parser.add_argument("--seed", type=int, default=0)
    _common.add_results_option(parser)
    args = parser.parse_args()
    args.shapes = args.shapes or list(SHAPES)
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
    peak = _common.MatmulPeak(size=args.peak_size)
    peak.measure("before")
    results = {name: bench_shape(name, args, peak) for name in args.shapes}
    peak.measure("after")
    print("\n" + peak.report())
    print("summary: " + ", ".join(f"{n} {r['ratios'][r['fastest']]:.2f}x the fastest peer ({r['fastest']}; target "
                                  f"{r['target']:g}x)" for n, r in results.items()))
    for r in results.values():
        _common.record(args.results, benchmark="Mamba-1 train step", shape=r["shape"], unit="tokens/s",
                       recurlen=r["recurlen"], peers=r["peers"], ratios=r["ratios"], higher_is_better=True,
                       target=f">= {r['target']:g}x the fastest", peak=peak.summary())
    print(f"# load average at end: {_common.load_average()}")
    if not all(r["same"] for r in results.values()):
        sys.exit("the models are not the same function: the timings compare different models")


if __name__ == "__main__":
    main()
