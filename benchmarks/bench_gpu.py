"""GPU check in one script: the kernel backend against the PyTorch backend, on the same model and inputs.

    python benchmarks/bench_gpu.py [--shapes tiny 130m] [--batch 4] [--length 2048] [--steps 10]   (make bench-gpu)

Needs CUDA and recurlen[cuda] (mamba-ssm; causal-conv1d optional). For each shape it prints, side by side:
  1. agreement (float32, no grad): max |logits diff| / max |logits| and the final SSM / conv state
     differences between backend="kernel" and backend="torch", from a random non-zero initial state;
     and the kernel's split invariance (one call vs two calls with the state carried);
  2. training throughput (forward + backward + fused AdamW, bf16 autocast, the same batch): tokens/s and
     peak memory of each backend, and the ratio kernel / torch.
Exits 2 with the reason when CUDA or the kernels are missing; exits 1 when an agreement check fails.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from recurlen import Mamba2LM, RecurrentState, preset
from recurlen.models.mamba2.kernels import _mamba_kernels, kernels_available

AGREE_TOL = 2e-3  # relative to the largest reference value; the float32 GPU tests use the same tolerance


def random_state(model: Mamba2LM, batch: int, seed: int) -> RecurrentState:
    g = torch.Generator(device="cuda").manual_seed(seed)
    zero = model.zero_state(batch)
    return RecurrentState(torch.randn(zero.ssm.shape, device="cuda", generator=g) * 0.3,
                          torch.randn(zero.conv.shape, device="cuda", generator=g) * 0.3)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-12))


@torch.no_grad()
def agreement(model: Mamba2LM, ids: torch.Tensor) -> dict[str, float]:
    init = random_state(model, ids.shape[0], seed=1)
    ref_logits, ref_state = model(ids, init, backend="torch")
    k_logits, k_state = model(ids, init, backend="kernel")
    cut = ids.shape[1] // 2 + 3  # not a multiple of the chunk size
    a_logits, mid = model(ids[:, :cut], init, backend="kernel")
    b_logits, split_state = model(ids[:, cut:], mid, backend="kernel")
    return {
        "logits kernel vs torch": rel(k_logits, ref_logits),
        "ssm state kernel vs torch": rel(k_state.ssm, ref_state.ssm),
        "conv state kernel vs torch": rel(k_state.conv, ref_state.conv),
        "kernel split vs one call": max(rel(torch.cat([a_logits, b_logits], 1), k_logits),
                                        rel(split_state.ssm, k_state.ssm)),
    }


def throughput(model: Mamba2LM, ids: torch.Tensor, backend: str, steps: int) -> tuple[float, float]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits, _ = model(ids[:, :-1], backend=backend)
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / steps
    return ids[:, :-1].numel() / seconds, torch.cuda.max_memory_allocated() / 2**30


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["tiny", "130m"])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA device; this script checks the GPU kernels", file=sys.stderr)
        return 2
    if not kernels_available():
        print(f"bench_gpu: mamba-ssm's kernels do not import ({_mamba_kernels()[1]}); "
              "install recurlen[cuda]", file=sys.stderr)
        return 2
    print(f"# {torch.cuda.get_device_name()} | torch {torch.__version__} | batch {args.batch} x length {args.length}")
    failed = []
    for shape in args.shapes:
        torch.manual_seed(0)
        model = Mamba2LM(preset(shape)).cuda()
        vocab = model.config.vocab_size
        ids = torch.randint(0, vocab, (args.batch, args.length + 1), device="cuda")
        print(f"\n== {shape}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters")
        for name, value in agreement(model, ids[:, :-1]).items():
            ok = value <= AGREE_TOL
            failed += [] if ok else [f"{shape}: {name}"]
            print(f"  {name:28s} {value:.2e}  {'OK' if ok else 'FAIL'} (tol {AGREE_TOL:.0e})")
        rows = {backend: throughput(model, ids, backend, args.steps) for backend in ("torch", "kernel")}
        for backend, (tok_s, mem) in rows.items():
            print(f"  train step {backend:7s} {tok_s:12,.0f} tok/s   peak {mem:6.2f} GiB")
        print(f"  ratio kernel / torch: {rows['kernel'][0] / rows['torch'][0]:.2f}x tokens/s, "
              f"{rows['kernel'][1] / rows['torch'][1]:.2f}x memory")
        del model
        torch.cuda.empty_cache()
    if failed:
        print("agreement FAILED: " + "; ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
