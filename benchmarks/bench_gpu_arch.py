"""Every architecture's kernel path against its PyTorch path on a GPU, side by side in one run.

    python benchmarks/bench_gpu_arch.py [--arch mamba2 gla] [--shape nano 130m] [--batch 4] [--length 2048]

For each architecture of the registry whose kernels import on this machine (the others are listed with the
reason), on the same model, inputs and random initial state:
  1. agreement, float32: max |diff| / max |reference| of the logits, of every part of the final state and of
     the gradients of every parameter and of the initial state, backend="kernel" vs backend="torch";
  2. split invariance of the kernel path (one call vs two calls with the state carried);
  3. training throughput at the larger shape (forward + backward + fused AdamW, bf16 autocast): tokens/s and
     peak GPU memory of each backend and the ratio kernel / torch.
Exits 2 without CUDA, 1 when an agreement check fails.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
from bench_gpu import throughput  # the same training step as the Mamba-2 GPU benchmark

from recurlen.models import registry, table

AGREE_TOL = 2e-3  # relative to the largest reference value, as benchmarks/bench_gpu.py and the GPU tests


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    if b.numel() == 0:  # a part this configuration does not use (GLA without short convs: no conv window)
        return 0.0
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-12))


def random_state(model, batch: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    zero = model.zero_state(batch)
    return type(zero)(*(torch.randn(t.shape, device="cuda", generator=g) * 0.3 for t in zero.parts().values()))


def agreement(model, ids: torch.Tensor, state) -> dict[str, float]:
    out = {}
    results = {}
    for backend in ("torch", "kernel"):
        model.zero_grad(set_to_none=True)
        h0 = state.clone()
        for t in h0.parts().values():
            t.requires_grad_(True)
        logits, final = model(ids, h0, backend=backend)
        (logits.float().pow(2).mean() + sum(t.float().pow(2).mean() for t in final.parts().values())).backward()
        results[backend] = (logits.detach(), final.detach(),
                            {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None},
                            {n: t.grad.detach().clone() for n, t in h0.parts().items()})
    (lt, ft, gt, ht), (lk, fk, gk, hk) = results["torch"], results["kernel"]
    out["logits"] = rel(lk, lt)
    for name in ft.part_names():
        out[f"state.{name}"] = rel(getattr(fk, name), getattr(ft, name))
        out[f"grad.initial.{name}"] = rel(hk[name], ht[name])
    out["grad.params (worst)"] = max(rel(gk[n], gt[n]) for n in gt)
    with torch.no_grad():
        full, full_state = model(ids, state, backend="kernel")
        cut = ids.shape[1] // 3
        a, mid = model(ids[:, :cut], state, backend="kernel")
        b, end = model(ids[:, cut:], mid, backend="kernel")
        out["split.logits"] = rel(torch.cat([a, b], dim=1), full)
        out["split.state (worst)"] = max(rel(getattr(end, n), getattr(full_state, n)) for n in end.part_names())
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", nargs="+", default=list(registry.architectures()))
    parser.add_argument("--shape", nargs=2, default=None, metavar=("SMALL", "LARGE"),
                        help="sizes in the model table: agreement at SMALL and LARGE, throughput at LARGE (default: "
                             "nano and each architecture's smallest official checkpoint's shape)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_gpu_arch: no CUDA device; on a CPU: make test-kernels", file=sys.stderr)
        return 2
    results, failed = {}, False
    for name in args.arch:
        a = registry.get(name)
        fns, why = a.model_cls.kernels.load()
        if fns is None:
            results[name] = {"skipped": f"{a.model_cls.kernels.what} did not import ({why})"}
            print(f"== {a.title}: skipped: {results[name]['skipped']}")
            continue
        entry = {}
        official = [row.size for row in table.rows(name) if row.hub_id is not None]
        shapes = args.shape or ["nano", official[0]]
        for size in shapes:
            small = size == shapes[0]
            torch.manual_seed(0)
            try:
                model = a.build(a.preset(size), backend="torch").cuda()
            except ValueError as err:
                entry[size] = {"skipped": str(err)}
                continue
            vocab = model.config.vocab_size
            length = 256 if small else min(args.length, 1024)
            ids = torch.randint(0, vocab, (2, length), device="cuda")
            agree = agreement(model, ids, random_state(model, 2, seed=1))
            bad = {k: v for k, v in agree.items() if not v <= AGREE_TOL}
            failed |= bool(bad)
            entry[size] = {"agreement": agree, "ok": not bad}
            print(f"== {a.title} {size}: agreement " + ", ".join(f"{k} {v:.1e}" for k, v in agree.items())
                  + (f"  FAILED {sorted(bad)}" if bad else "  [OK]"))
            if not small:
                ids = torch.randint(0, vocab, (args.batch, args.length + 1), device="cuda")
                speed = {b: dict(zip(("tokens_per_s", "peak_gib"), throughput(model, ids, b, args.steps)))
                         for b in ("kernel", "torch")}
                speed["ratio"] = speed["kernel"]["tokens_per_s"] / speed["torch"]["tokens_per_s"]
                entry[size]["throughput"] = speed
                print(f"   train step bf16 {args.batch} x {args.length}: kernel {speed['kernel']['tokens_per_s']:.0f} "
                      f"tok/s ({speed['kernel']['peak_gib']:.1f} GiB), torch {speed['torch']['tokens_per_s']:.0f} "
                      f"tok/s ({speed['torch']['peak_gib']:.1f} GiB): kernel / torch {speed['ratio']:.2f}x")
            del model
            torch.cuda.empty_cache()
        results[name] = entry
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
