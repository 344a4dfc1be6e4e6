"""Training-step throughput: recurlen's CPU path against transformers' Mamba2ForCausalLM, same run.

    python benchmarks/bench_train_step.py              # tiny and 130m shapes
    python benchmarks/bench_train_step.py --quick      # both shapes, fewer steps (make bench)
    python benchmarks/bench_train_step.py --shapes 130m --threads 2 --repeats 5

One step = forward + next-token cross-entropy + backward + AdamW step, all float32, on the same token
batch, with the same weights, optimizer settings and number of threads. The peer is transformers'
`Mamba2ForCausalLM` on its pure-PyTorch path (no mamba-ssm / causal-conv1d kernels), built from a
config of the same shape. Before timing, recurlen's weights are copied into the peer and the logits
(and the training gradients) must agree: the benchmark compares two implementations of one function.

The two models' steps alternate (A B, B A, ...) so that drift in machine load hits both alike; the
table reports medians of the whole step and of its two parts (forward + backward, AdamW step), and
the process CPU time per step (less sensitive than wall time to other jobs on the machine). The
AdamW step is the same code for both models: torch.optim.AdamW(fused=True) by default. The for-loop
AdamW (`--adamw default`, torch's choice on CPU) makes several passes and parameter-sized
temporaries every step: at the 130m shape 0.3-0.6 s on an idle 2-core machine (over a second when
other jobs compete for memory bandwidth) against 0.06 s fused, which flattens the ratio without
saying anything about either model. The forward + backward ratio is printed too.

Model FLOPs per token (achieved FLOP/s = this x tokens/s; the same count is used for both models, so
their FLOP/s ratio is their throughput ratio):
  dense = 6 x (per layer: in_proj + out_proj + depthwise-conv weights; plus the LM head)
          6 = 2 forward + 4 backward FLOPs per weight and token. A tied embedding is counted once, as
          the LM-head matmul; the embedding lookup, norms and elementwise ops are not counted.
  ssd   = 3 x n_layer x (2 l N G + 2 l H P + 4 H P N)
          the chunked SSD forward at chunk length l: C.B^T scores (once per group), scores @ x (per
          head), chunk states and state -> outputs (per head), full l x l blocks as the chunked
          algorithm computes them; backward = 2 x forward.
The peak is the fastest of several float32 (size x size) @ (size x size) torch.matmul calls, measured in the
same process before the shapes, between every round of timed steps and after the shapes; "% of peak" divides
by the largest of them (_common.MatmulPeak says why), and all of them are printed with the load average.

transformers (5.x) has one CPU path for Mamba-2: the chunked SSD in PyTorch (`mamba2_chunk_scan`); its other
paths are mamba-ssm / causal-conv1d / Hub kernels, which run on CUDA only. The peer runs that path at the
model's chunk size; `--peer-chunk-size` gives it another (the result does not depend on the chunk size).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import _common
import torch
from _common import ADAMW_IMPLS, Timing, make_train_step, next_token_loss, run_interleaved

import recurlen
from recurlen import Mamba2Config, Mamba2LM, preset

SHAPES = {
    # name: (model config, batch, length, target ratio recurlen / transformers)
    "tiny": (lambda: preset("tiny", n_layer=4), 8, 512, 2.0),
    # 2x at 130m is the goal; dense matmuls running near the core's peak are ~75% of recurlen's step there, so
    # what is left to win is small (docs/benchmarks.md).
    "130m": (lambda: preset("130m"), 1, 512, 2.0),
}
LOGITS_TOL = 1e-4


# ---------------------------------------------------------------------------------- the peer
def transformers_peer(model: Mamba2LM) -> torch.nn.Module:
    """transformers' Mamba2ForCausalLM of the same shape, holding a copy of `model`'s weights."""
    from transformers import Mamba2Config as HFMamba2Config
    from transformers import Mamba2ForCausalLM

    cfg = model.config
    hf_cfg = HFMamba2Config(
        vocab_size=cfg.padded_vocab_size, hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layer,
        state_size=cfg.d_state, head_dim=cfg.headdim, num_heads=cfg.nheads, expand=cfg.expand,
        n_groups=cfg.ngroups, conv_kernel=cfg.d_conv, chunk_size=cfg.chunk_size,
        tie_word_embeddings=cfg.tie_embeddings, layer_norm_epsilon=cfg.norm_eps,
        residual_in_fp32=cfg.residual_in_fp32, use_bias=cfg.bias, use_conv_bias=cfg.conv_bias,
        time_step_min=cfg.dt_min, time_step_max=cfg.dt_max, time_step_floor=cfg.dt_init_floor,
        time_step_limit=tuple(cfg.dt_limit),
    )
    peer = Mamba2ForCausalLM(hf_cfg)
    # Same names except the embedding: recurlen keeps the official `embedding`, transformers `embeddings`.
    weights = {peer_name(name): t for name, t in model.state_dict().items()}
    missing, unexpected = peer.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"weight mapping recurlen -> transformers is incomplete: missing {missing}, "
                           f"unexpected {unexpected}")
    if cfg.tie_embeddings and peer.lm_head.weight.data_ptr() != peer.backbone.embeddings.weight.data_ptr():
        raise RuntimeError("transformers peer: lm_head is not tied to the embedding after loading")
    return peer


def peer_name(name: str) -> str:
    return name.replace("backbone.embedding.", "backbone.embeddings.")


def kernel_packages() -> str:
    import importlib.util

    found = {p: importlib.util.find_spec(p) is not None for p in ("mamba_ssm", "causal_conv1d", "kernels")}
    if any(found.values()):
        print(f"# WARNING: {[p for p, ok in found.items() if ok]} importable: the peer may not use its "
              "pure-PyTorch path", file=sys.stderr)
    return ", ".join(f"{p} {'present' if ok else 'absent'}" for p, ok in found.items())


# ---------------------------------------------------------------------------------- equivalence
def check_same_function(model: Mamba2LM, peer: torch.nn.Module, *, batch: int, length: int, seed: int) -> bool:
    """Logits (eval) and loss + gradients (train) of the two models on one input; prints the differences."""
    cfg = model.config
    vocab = cfg.vocab_size
    ids = torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))
    model.eval()
    peer.eval()
    with torch.no_grad():
        ours, _ = model(ids, backend="torch")
        theirs = peer(ids, use_cache=False).logits[..., :vocab]
    diff = (ours - theirs).abs().max().item()
    ok = diff <= LOGITS_TOL
    print(f"same function: max|logits diff| {diff:.2e} (max|logits| {ours.abs().max().item():.2f}) on "
          f"{batch} x {length} tokens (crosses chunks of {cfg.chunk_size}, with padding) "
          f"[{'OK' if ok else 'MISMATCH'}, tol {LOGITS_TOL:.0e}]")
    if not ok:
        explain_mismatch(model, peer, ids)

    model.train()
    peer.train()
    losses = []
    for logits_fn in (lambda x: model(x, backend="torch")[0], lambda x: peer(x, use_cache=False).logits):
        loss = next_token_loss(logits_fn(ids), ids, vocab)
        loss.backward()
        losses.append(loss.item())
    peer_params = dict(peer.named_parameters())
    worst_name, worst = "", 0.0
    for name, p in model.named_parameters():
        q = peer_params[peer_name(name)]
        rel = ((p.grad - q.grad).abs().max() / p.grad.abs().max().clamp_min(1e-30)).item()
        if rel >= worst:
            worst_name, worst = name, rel
    model.zero_grad(set_to_none=True)
    peer.zero_grad(set_to_none=True)
    print(f"same gradients: loss {losses[0]:.6f} vs {losses[1]:.6f}; worst max|grad diff| / max|grad| "
          f"{worst:.1e} ({worst_name})")
    return ok


def explain_mismatch(model: Mamba2LM, peer: torch.nn.Module, ids: torch.Tensor) -> None:
    """Compare the embedding and every mixer's output (each fed by its own model) to find where they split."""
    outs: dict[str, list[torch.Tensor]] = {"ours": [], "theirs": []}
    hooks = [model.backbone.embedding.register_forward_hook(lambda m, i, o: outs["ours"].append(o)),
             peer.backbone.embeddings.register_forward_hook(lambda m, i, o: outs["theirs"].append(o))]
    for a, b in zip(model.backbone.layers, peer.backbone.layers):
        hooks.append(a.mixer.register_forward_hook(lambda m, i, o: outs["ours"].append(o[0])))
        hooks.append(b.mixer.register_forward_hook(lambda m, i, o: outs["theirs"].append(o)))
    with torch.no_grad():
        model(ids, backend="torch")
        peer(ids, use_cache=False)
    for h in hooks:
        h.remove()
    names = ["embedding"] + [f"layer {i} mixer" for i in range(len(model.backbone.layers))]
    for name, a, b in zip(names, outs["ours"], outs["theirs"]):
        print(f"    {name:>16}: max|diff| {(a - b).abs().max().item():.2e}  (max|out| {a.abs().max().item():.2f})")


# ---------------------------------------------------------------------------------- timing
def train_flops_per_token(cfg: Mamba2Config) -> tuple[float, float]:
    """(dense, ssd) FLOPs per token of one training step; see the module docstring."""
    per_layer = cfg.d_in_proj * cfg.d_model + cfg.d_inner * cfg.d_model + cfg.conv_dim * cfg.d_conv
    dense = 6.0 * (cfg.n_layer * per_layer + cfg.padded_vocab_size * cfg.d_model)
    l, n, g, h, p = cfg.chunk_size, cfg.d_state, cfg.ngroups, cfg.nheads, cfg.headdim
    ssd = 3.0 * cfg.n_layer * (2 * l * n * g + 2 * l * h * p + 4 * h * p * n)
    return dense, ssd


def print_timings(times: dict[str, Timing], tokens: int, per_token: float | None = None) -> dict[str, float]:
    """The per-implementation table (medians); returns tokens/s per implementation."""
    flops_cols = f" {'GFLOP/s':>8}" if per_token else ""
    print(f"{'':<22} {'step ms':>9} {'[min - max]':>17} {'fwd+bwd ms':>11} {'AdamW ms':>9} {'cpu ms':>8} "
          f"{'tokens/s':>10}{flops_cols}")
    tok_s = {}
    for impl, t in times.items():
        step = statistics.median(t.steps)
        tok_s[impl] = tokens / step
        spread = f"[{min(t.steps) * 1e3:.0f} - {max(t.steps) * 1e3:.0f}]"
        flops = f" {per_token * tok_s[impl] / 1e9:>8.1f}" if per_token else ""
        print(f"{impl:<22} {step * 1e3:>9.1f} {spread:>17} {statistics.median(t.fwd_bwd) * 1e3:>11.1f} "
              f"{statistics.median(t.opt) * 1e3:>9.1f} {statistics.median(t.cpu) * 1e3:>8.0f} {tok_s[impl]:>10.1f}"
              f"{flops}")
    return tok_s


def bench_shape(name: str, args: argparse.Namespace, peak: _common.MatmulPeak) -> dict:
    """Check and time one shape; returns its row of the summary (tokens/s per model, FLOPs/token, same function)."""
    make_cfg, batch, length, target = SHAPES[name]
    cfg = make_cfg()
    if args.chunk_size is not None:
        cfg = Mamba2Config.from_dict({**cfg.to_dict(), "chunk_size": args.chunk_size})
    batch = args.batch or batch
    length = args.length or length
    tokens = batch * length
    print(f"\n== {name}: d_model {cfg.d_model}, {cfg.n_layer} layers, d_state {cfg.d_state}, headdim {cfg.headdim}, "
          f"{cfg.nheads} heads, chunk {cfg.chunk_size}, vocab {cfg.vocab_size} (padded {cfg.padded_vocab_size}); "
          f"batch {batch} x length {length} = {tokens} tokens/step")

    torch.manual_seed(args.seed)
    model = Mamba2LM(cfg, backend="torch")
    peer = transformers_peer(model)
    n_params = model.num_parameters()
    same = True
    if not args.no_check:
        check_len = cfg.chunk_size + cfg.chunk_size // 2 + 3
        same = check_same_function(model, peer, batch=2, length=check_len, seed=args.seed)
    peer_chunk = args.peer_chunk_size or cfg.chunk_size
    for layer in peer.backbone.layers:
        layer.mixer.chunk_size = peer_chunk

    ids = torch.randint(0, cfg.vocab_size, (batch, length), generator=torch.Generator().manual_seed(args.seed + 1))
    model.train()
    peer.train()
    peer_name_ = f"transformers (chunk {peer_chunk})"
    impls = {
        "recurlen": make_train_step(lambda x: model(x, backend="torch")[0], model.parameters(), ids, cfg.vocab_size,
                                    adamw=args.adamw),
        peer_name_: make_train_step(lambda x: peer(x, use_cache=False).logits, peer.parameters(), ids,
                                    cfg.vocab_size, adamw=args.adamw),
    }
    times = run_interleaved(impls, warmup=args.warmup, repeats=args.repeats, peak=peak)

    dense, ssd = train_flops_per_token(cfg)
    per_token = dense + ssd
    print(f"params {n_params / 1e6:.2f} M; model FLOPs/token {_common.fmt_si(dense)} dense + "
          f"{_common.fmt_si(ssd)} SSD = {_common.fmt_si(per_token)}; AdamW {args.adamw}; {args.warmup} warm-up + "
          f"{args.repeats} timed steps each; medians")
    tok_s = print_timings(times, tokens, per_token)
    fwd_bwd = {impl: statistics.median(t.fwd_bwd) for impl, t in times.items()}
    cpu = {impl: statistics.median(t.cpu) for impl, t in times.items()}
    ratio = tok_s["recurlen"] / tok_s[peer_name_]
    verdict = "met" if ratio >= target else "MISSED"
    print(f"ratio recurlen / transformers: {ratio:.2f}x per step (target >= {target:g}x: {verdict}); "
          f"{fwd_bwd[peer_name_] / fwd_bwd['recurlen']:.2f}x forward + backward alone; "
          f"{cpu[peer_name_] / cpu['recurlen']:.2f}x in process CPU time per step")
    return {"shape": f"{name} {batch}x{length}", "tok_s": tok_s, "per_token": per_token, "same": same,
            "target": target}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 warm-up + 3 timed steps (make bench)")
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), help="shapes to run (default: all)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps per model (default 2, quick 1)")
    parser.add_argument("--repeats", type=int, default=None, help="timed steps per model (default 7, quick 3)")
    parser.add_argument("--batch", type=int, default=None, help="override the batch size of every shape")
    parser.add_argument("--length", type=int, default=None, help="override the sequence length of every shape")
    parser.add_argument("--chunk-size", type=int, default=None, help="override the SSD chunk size (both models)")
    parser.add_argument("--adamw", choices=sorted(ADAMW_IMPLS), default="fused",
                        help="torch.optim.AdamW implementation, the same for both models (default: fused; "
                             "'default' is torch's choice, the for-loop on CPU, as recurlen.training.optim builds it)")
    parser.add_argument("--peak-size", type=int, default=2048, help="matmul size for the float32 peak")
    parser.add_argument("--peer-chunk-size", type=int, default=None,
                        help="the peer's SSD chunk size (default: the model's)")
    parser.add_argument("--no-check", action="store_true", help="skip the same-function check")
    _common.add_results_option(parser)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.shapes = args.shapes or list(SHAPES)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    args.repeats = args.repeats if args.repeats is not None else (3 if args.quick else 7)
    if args.repeats <= 0 or args.warmup < 0:
        parser.error(f"--repeats must be > 0 and --warmup >= 0; got {args.repeats}, {args.warmup}")

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the peer is built from a config; nothing is downloaded
    import transformers
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # silences the "falling back to the PyTorch implementation" notices
    threads = _common.set_threads(args.threads)
    _common.print_environment("training step: recurlen (backend='torch') vs transformers Mamba2ForCausalLM",
                              threads)
    print(f"# recurlen from {os.path.dirname(recurlen.__file__)}; transformers {transformers.__version__}; "
          f"kernel packages: {kernel_packages()}")
    peak = _common.MatmulPeak(size=args.peak_size, repeats=5 if args.quick else 10)
    peak.measure("before")
    results = {name: bench_shape(name, args, peak) for name in args.shapes}
    peak.measure("after")
    print("\n" + peak.report())
    for name, row in results.items():
        recurlen_tok_s = row["tok_s"].pop("recurlen")
        ratios = {peer: recurlen_tok_s / tok_s for peer, tok_s in row["tok_s"].items()}
        pct = row["per_token"] * recurlen_tok_s / peak.denominator
        peer_pct = {peer: row["per_token"] * tok_s / peak.denominator for peer, tok_s in row["tok_s"].items()}
        print(f"summary {name}: recurlen {recurlen_tok_s:.0f} tokens/s = {pct:.1%} of peak; "
              + ", ".join(f"{ratios[p]:.2f}x {p} ({peer_pct[p]:.1%} of peak)" for p in ratios)
              + f" (target {row['target']:g}x)")
        _common.record(args.results, benchmark="Mamba-2 train step", shape=row["shape"], unit="tokens/s",
                       recurlen=recurlen_tok_s, peers=row["tok_s"], ratios=ratios, higher_is_better=True,
                       target=f">= {row['target']:g}x", pct_of_peak=pct, peak=peak.summary())
    print(f"# load average at end: {_common.load_average()}")
    mismatched = [name for name, row in results.items() if not row["same"]]
    if mismatched:
        sys.exit(f"the two models are not the same function at {mismatched}: the timings compare different models")


if __name__ == "__main__":
    main()
