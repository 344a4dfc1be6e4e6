"""Any registry architecture's training step on CPU as a fraction of the float32 matmul peak; Gated DeltaNet's scan
against fla's pure-PyTorch references.

    python benchmarks/bench_arch_step.py                         # Mamba-3 and Gated DeltaNet, their large shapes
    python benchmarks/bench_arch_step.py --quick                 # tiny, and large at 1 x 128, fewer steps (make bench)
    python benchmarks/bench_arch_step.py --arch gated_deltanet --shapes large --length 1024 --threads 2

The architecture, its model class and its tiny shape come from the registry (recurlen.models.registry); `--arch`
takes any of its names (default: the architectures without a benchmark script of their own, ARCHS). Shapes:
  tiny   the model table's `<arch>-tiny` row, batch 8 x 512;
  large  LARGE[arch] on top of the tiny row, batch 1 x 512: Mamba-3 at Mamba-2 130m's width (d_model 768,
         24 layers, d_state 128, headdim 64, vocabulary 50277), Gated DeltaNet at fla's 340M config
         (flame's configs/gated_deltanet_340M.json: hidden 1024, 21 layers, 6 heads of 256 keys x 512 values,
         MLP ratio 4, fla's default vocabulary 32000), which holds 512.3 M parameters (446.7 M without the
         embedding and the head): fla's name is the config's, not its count; neither has a released checkpoint in
         the model table. An architecture not in LARGE uses its smallest official row.
One step = forward + next-token cross-entropy + backward + AdamW (fused) step, float32, backend='torch'.

Model FLOPs per token are counted, not derived per architecture: one forward + backward of the same batch runs
under torch.utils.flop_counter.FlopCounterMode, which adds up every matmul, batched matmul and convolution (dense
projections 6 per weight and token, the chunked scans' products as their CPU code computes them, full l x l blocks
included; elementwise ops, norms, the triangular solves and the optimizer are not counted). The dense share (6 x
the 2-D weights apart from the embedding, the tied head counted once) is printed beside it.

The peak is the fastest float32 (size x size) matmul, measured before the model, between every timed step and
after it; "% of peak" divides by the largest (_common.MatmulPeak says why).

Peers, where one runs on CPU:
  Gated DeltaNet  fla-core's naive_recurrent_gated_delta_rule (a loop over tokens) and naive_chunk_gated_delta_rule
                  (chunked, a loop over positions for the UT transform) against recurlen's gated_delta_chunked, on
                  the same inputs at one large layer's shape, forward + backward, interleaved; outputs are checked
                  to agree first.
  Mamba-3         none: mamba-ssm's Mamba-3 kernels are Triton (GPU, or Triton's interpreter, which is a test,
                  not a speed); the script says so.
"""

from __future__ import annotations

import argparse
import statistics
import time

import _common
import torch
from torch.utils.flop_counter import FlopCounterMode

from recurlen.models import registry, table

ARCHS = ("mamba3", "gated_deltanet")
LARGE = {
    # arch: (name of the shape, fields over the tiny row)
    "mamba3": ("130m-like", dict(d_model=768, n_layer=24, d_state=128, headdim=64, expand=2, vocab_size=50277,
                                 pad_vocab_size_multiple=16)),
    # fla's 340M config as flame writes it (512.3 M parameters; the shape named 340m-like before, 24 layers of 4
    # heads, held 475.1 M)
    "gated_deltanet": ("fla-340M-config", dict(hidden_size=1024, num_hidden_layers=21, num_heads=6, head_dim=256,
                                               expand_v=2.0, hidden_ratio=4, intermediate_size=None,
                                               vocab_size=32000)),
}
SHAPES = {"tiny": (8, 512, 512), "large": (1, 512, 128)}  # shape: (batch, length, --quick length)
NO_PEER = {"mamba3": "no CPU peer: mamba-ssm's Mamba-3 (mamba3_siso_combined) is Triton only"}
PEER_TOL = 1e-4  # max |diff| / max |reference| of the outputs, float32


def config_of(arch, shape: str):
    """The config of `shape` for a registry architecture, and the shape's printed name."""
    if shape == "tiny":
        return arch.preset("tiny"), "tiny"
    if arch.name in LARGE:
        name, fields = LARGE[arch.name]
        return arch.preset("tiny", **fields), name
    official = [row for row in table.rows(arch.name) if row.hub_id is not None]
    if not official:
        raise SystemExit(f"{arch.title} has no large shape: add it to LARGE in benchmarks/bench_arch_step.py")
    return arch.preset(official[0].size), official[0].size


def count_flops(model: torch.nn.Module, ids: torch.Tensor, vocab: int) -> float:
    """Matmul and convolution FLOPs of one forward + backward (the loss included), per token."""
    with FlopCounterMode(display=False) as counter:
        _common.next_token_loss(model(ids)[0], ids, vocab).backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops() / ids.numel()


def dense_flops(model: torch.nn.Module) -> float:
    """6 x the 2-D weights apart from the embedding (a tied head is the embedding: counted once, as the head)."""
    weights = {p.data_ptr(): p.numel() for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n}
    for module in model.modules():  # the LM head: the one linear map onto the (padded) vocabulary
        if isinstance(module, torch.nn.Linear) and module.weight.shape[0] >= model.config.vocab_size:
            weights[module.weight.data_ptr()] = module.weight.numel()
    return 6.0 * sum(weights.values())


def bench_shape(arch, shape: str, args: argparse.Namespace, peak: _common.MatmulPeak) -> dict:
    cfg, shape_name = config_of(arch, shape)
    batch, length, quick_length = SHAPES[shape]
    batch, length = args.batch or batch, args.length or (quick_length if args.quick else length)
    torch.manual_seed(args.seed)
    model = arch.build(cfg, backend="torch")
    vocab = cfg.vocab_size
    ids = torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(args.seed + 1))
    params = sum(p.numel() for p in model.parameters())
    print(f"\n== {arch.title} {shape_name}: {arch.describe(cfg)}; {params / 1e6:.1f} M params; "
          f"batch {batch} x length {length}")
    per_token = count_flops(model, ids, vocab)
    dense = dense_flops(model)
    print(f"model FLOPs/token (counted, forward + backward): {_common.fmt_si(per_token)}, of which dense weights "
          f"{_common.fmt_si(dense)} ({dense / per_token:.0%}); the rest is the scan, convolutions and the loss")
    r = _common.time_lm_step(model, vocab=vocab, batch=batch, length=length, flops_per_token=per_token,
                             args=args, peak=peak)
    return {"shape": f"{shape_name} {batch}x{length}", **r}


# ---------------------------------------------------------------------------------- Gated DeltaNet's scan peers
def gdn_scan_peers(args: argparse.Namespace, peak: _common.MatmulPeak) -> dict | None:
    """recurlen's chunked scan vs fla's naive recurrent and chunked forms, forward + backward, interleaved, at one
    layer of fla's 340M config (batch 1 x 512, --quick 1 x 128: fla's recurrence loops over tokens, ~0.1 s each
    forward + backward at this width; 6 heads of 256 x 512); None without fla-core."""
    try:
        from fla.ops.gated_delta_rule.naive import naive_chunk_gated_delta_rule, naive_recurrent_gated_delta_rule
    except Exception as err:  # fla-core is optional (make test-kernels and make bench install it)
        print(f"\n(no Gated DeltaNet scan peer: fla-core does not import: {type(err).__name__})")
        return None
    from recurlen.models.gated_deltanet.scan import gated_delta_chunked

    batch, length, heads, dk, dv, chunk = 1, args.peer_length or (128 if args.quick else 512), 6, 256, 512, 64
    gen = torch.Generator().manual_seed(args.seed)
    q, k = (torch.nn.functional.normalize(torch.randn(batch, length, heads, dk, generator=gen), dim=-1)
            for _ in range(2))  # L2-normalised, as the layer feeds them
    v = torch.randn(batch, length, heads, dv, generator=gen)
    g = -torch.nn.functional.softplus(torch.randn(batch, length, heads, generator=gen) - 3.0)  # log decays
    beta = torch.rand(batch, length, heads, generator=gen)
    scale = dk**-0.5
    leaves = [t.requires_grad_(True) for t in (q, k, v, g, beta)]
    do = torch.randn(batch, length, heads, dv, generator=gen)
    impls = {
        "recurlen": lambda: gated_delta_chunked(q, k, v, g, beta, scale=scale, chunk_size=chunk)[0],
        "fla naive recurrent": lambda: naive_recurrent_gated_delta_rule(q, k, v, beta, g, scale=scale)[0],
        "fla naive chunk": lambda: naive_chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=chunk, scale=scale)[0],
    }
    with torch.no_grad():
        ref = impls["fla naive recurrent"]()
        errs = {name: float((fn() - ref).abs().max() / ref.abs().max()) for name, fn in impls.items()}

    def fwd_bwd(fn) -> float:
        start = time.perf_counter()
        (fn() * do).sum().backward()
        for t in leaves:
            t.grad = None
        return time.perf_counter() - start

    order = list(impls)
    times: dict[str, list[float]] = {name: [] for name in order}
    for name in order:
        fwd_bwd(impls[name])
    for r in range(args.repeats):
        for name in order[r % 3:] + order[:r % 3]:
            times[name].append(fwd_bwd(impls[name]))
        peak.between()
    ms = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    ratios = {name: ms[name] / ms["recurlen"] for name in order[1:]}
    print(f"\n== Gated DeltaNet scan, forward + backward, batch {batch} x {length}, {heads} heads of {dk} x {dv}, "
          f"chunk {chunk}: " + ", ".join(f"{name} {t:.0f} ms" for name, t in ms.items()))
    print("outputs vs fla's naive recurrence (max |diff| / max |ref|): "
          + ", ".join(f"{name} {e:.1e}" for name, e in errs.items() if name != "fla naive recurrent")
          + f" [{'OK' if max(errs.values()) <= PEER_TOL else 'MISMATCH'}, tol {PEER_TOL:.0e}]")
    return {"shape": f"{batch}x{length}, {heads} heads of {dk} x {dv}", "ms": ms, "ratios": ratios,
            "same": max(errs.values()) <= PEER_TOL}


def main() -> None:
    parser = _common.lm_peak_parser(__doc__, SHAPES, default="large", quick="tiny and large (1 x 128) shapes")
    parser.add_argument("--arch", nargs="+", choices=list(registry.architectures()), default=list(ARCHS),
                        help=f"registry architectures (default: {' '.join(ARCHS)})")
    parser.add_argument("--peer-length", type=int, default=None,
                        help="tokens of Gated DeltaNet's scan comparison (default 512, quick 128)")
    args = parser.parse_args()
    archs = [registry.get(name) for name in args.arch]
    peak = _common.start_lm_peak(args, f"{', '.join(a.title for a in archs)} training step (backend='torch'): "
                                 "fraction of the float32 matmul peak", default=["large"], quick=list(SHAPES))
    results = {a.name: {shape: bench_shape(a, shape, args, peak) for shape in args.shapes} for a in archs}
    peers = gdn_scan_peers(args, peak) if "gated_deltanet" in args.arch else None
    peak.measure("after")
    for a in archs:
        if a.name in NO_PEER:
            print(f"\n{a.title}: {NO_PEER[a.name]}; its rows are % of the float32 matmul peak only")
    _common.report_lm_shapes({f"{a.title} {s}": {**r, "benchmark": f"{a.title} train step"}
                              for a in archs for s, r in results[a.name].items()}, peak,
                             benchmark="train step", path=args.results)
    if peers is not None:
        print("summary Gated DeltaNet scan (forward + backward): "
              + ", ".join(f"{r:.2f}x {name}" for name, r in peers["ratios"].items()))
        _common.record(args.results, benchmark="Gated DeltaNet scan, fwd + bwd", shape=peers["shape"], unit="ms",
                       recurlen=peers["ms"]["recurlen"],
                       peers={name: t for name, t in peers["ms"].items() if name != "recurlen"},
                       ratios=peers["ratios"], higher_is_better=False)
    print(f"# load average at end: {_common.load_average()}")
    if peers is not None and not peers["same"]:
        raise SystemExit("the Gated DeltaNet scans do not agree: the timings compare different functions")


if __name__ == "__main__":
    main()
