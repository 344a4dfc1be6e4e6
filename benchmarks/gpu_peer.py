"""recurlen's whole training step against mamba-ssm's own `MambaLMHeadModel` of the same config, side by side.

    compare_train_step(shape="130m", batch=8, length=2048, device="cuda", rounds=10, report=...)

One step = forward + next-token cross-entropy + backward + AdamW (recurlen.training.optim.build_optimizer, the
optimizer a run uses, for both), under bf16 autocast on CUDA (float32 on a CPU rehearsal), kernels on:
  recurlen             Mamba2LM, backend="kernel" (mamba-ssm's Triton SSD scan and gated RMSNorm), the loss as a
                       training step computes it (lit_module.head_token_loss with trainer.head_loss=auto: chunked at
                       these shapes);
  recurlen_plain_loss  the same model and optimizer, the loss on the whole float32 logits (trainer.head_loss=plain):
                       what the chunked loss saves;
  mamba_ssm            MambaLMHeadModel (Mamba-2 layers, fused add + norm, its mem-efficient fused conv + scan path
                       when causal-conv1d is installed, which needs it), holding recurlen's weights, with the usual
                       loss: cross-entropy of its logits (all padded rows) in float32.
The logits of the two models are checked to agree first (float32, no autocast). Steps run in interleaved rounds, the
order rotated every round, after warm-up steps (Triton's autotuning). Peak memory is measured in the same run, per
step: (the largest allocation during the step - what was allocated before it) + the peer's own resident tensors
(weights, optimizer state), i.e. what a process holding that model alone would peak at. MFU = 6 x parameters x
tokens/s / the GPU's dense bf16 peak (from its name; also a measured bf16 matmul peak), or, on a CPU rehearsal, the
measured float32 matmul peak. `report(result)` is called after every round with what is measured so far, so a run
cut short keeps it.
"""

from __future__ import annotations

import statistics
import sys
import time
import types
from collections.abc import Callable

import torch
import torch.nn.functional as F

SHAPES = {"130m": 8, "780m": 4}
"""The model table's shapes the GPU check compares, and their default lanes of 2048 tokens."""
REHEARSAL_SHAPE = dict(d_model=32, n_layer=2, d_state=16, headdim=16, chunk_size=16, vocab_size=257,
                       pad_vocab_size_multiple=8)
"""--cpu-rehearsal: a Mamba-2 small enough for Triton's interpreter, with every part of the real shapes."""
TOKENS_PER_S_TARGET = 0.95  # recurlen / mamba-ssm
MEMORY_TARGET = 1.0  # recurlen's peak / mamba-ssm's
AGREE_TOL = 2e-3  # logits, relative to the largest (as bench_gpu's kernel-vs-torch agreement)
BF16_DENSE_TFLOPS = (("H200", 989.4), ("GH200", 989.4), ("H100 PCIe", 756.0), ("H100", 989.4), ("H800", 989.4),
                     ("A100", 312.0), ("A800", 312.0), ("L40S", 362.0), ("L4", 121.0))
"""Dense bf16 tensor-core peaks from NVIDIA's data sheets (SXM unless named), by a substring of the device name."""


def import_mamba_lm() -> tuple[type, type]:
    """mamba-ssm's MambaLMHeadModel and MambaConfig from a build without its CUDA extensions.

    Its package __init__ and mixer_seq_simple import Mamba-1's CUDA scan extension (selective_scan_cuda), which a
    Python-only build (MAMBA_SKIP_CUDA_BUILD=TRUE, what make gpu-check installs) lacks; a model of Mamba-2 layers
    never calls it. An empty module stands in for the missing extension (calling Mamba-1 then fails with an
    AttributeError), and the package is imported without its __init__ as recurlen's kernel path does."""
    from recurlen.models.backends import import_without_failing_init

    def load():
        from mamba_ssm.models.config_mamba import MambaConfig
        from mamba_ssm.models.mixer_seq_simple import MambaLMHeadModel

        return MambaLMHeadModel, MambaConfig

    try:
        import selective_scan_cuda  # noqa: F401  (a full build has it)
    except ImportError:
        sys.modules["selective_scan_cuda"] = types.ModuleType("selective_scan_cuda")
    loaded, why = import_without_failing_init("mamba_ssm", load, "its models without Mamba-1's CUDA extension")
    if loaded is None:
        raise RuntimeError(f"mamba-ssm's MambaLMHeadModel does not import ({why})")
    return loaded


def recurlen_config(shape: str):
    from recurlen import preset

    return preset("nano", **REHEARSAL_SHAPE) if shape == "rehearsal" else preset(shape)


def peer_model(model, *, fused_conv: bool) -> torch.nn.Module:
    """MambaLMHeadModel of recurlen's model's config, holding a copy of its weights (the official names match)."""
    MambaLMHeadModel, MambaConfig = import_mamba_lm()
    c = model.config
    ssm = dict(layer="Mamba2", d_state=c.d_state, d_conv=c.d_conv, expand=c.expand, headdim=c.headdim,
               ngroups=c.ngroups, chunk_size=c.chunk_size, conv_bias=c.conv_bias, bias=c.bias,
               dt_limit=tuple(c.dt_limit), use_mem_eff_path=fused_conv)
    cfg = MambaConfig(d_model=c.d_model, d_intermediate=0, n_layer=c.n_layer, vocab_size=c.vocab_size, ssm_cfg=ssm,
                      rms_norm=c.rms_norm, residual_in_fp32=c.residual_in_fp32, fused_add_norm=True,
                      pad_vocab_size_multiple=c.pad_vocab_size_multiple, tie_embeddings=c.tie_embeddings)
    device = next(model.parameters()).device
    peer = MambaLMHeadModel(cfg, device=device)
    peer.load_state_dict(model.state_dict(), strict=True)
    return peer


def bf16_peak_flops(device_name: str) -> float | None:
    for key, tflops in BF16_DENSE_TFLOPS:
        if key in device_name:
            return tflops * 1e12
    return None


def measured_matmul_peak(device: str) -> tuple[float, str]:
    """FLOP/s of a large square matmul: bf16 on CUDA, float32 on CPU (fastest of a few after a warm-up)."""
    if device == "cpu":
        sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
        import _common

        return _common.measure_matmul_peak(size=1024, repeats=3), "float32"
    n = 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    best = float("inf")
    for i in range(6):
        torch.cuda.synchronize()
        start = time.perf_counter()
        a @ b
        torch.cuda.synchronize()
        if i:
            best = min(best, time.perf_counter() - start)
    return 2.0 * n**3 / best, "bfloat16"


def resident_bytes(model: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
    tensors = {id(p): p for p in model.parameters()}
    for p in model.parameters():
        if p.grad is not None:
            tensors[id(p.grad)] = p.grad
    for state in opt.state.values():
        for t in state.values():
            if isinstance(t, torch.Tensor):
                tensors[id(t)] = t
    return sum(t.numel() * t.element_size() for t in tensors.values())


def compare_train_step(*, shape: str, batch: int, length: int, device: str, rounds: int, warmup: int = 2,
                       head_loss: str = "auto", report: Callable[[dict], None] = lambda result: None) -> dict:
    """Measure the three steps side by side (module docstring); returns (and reports as it goes) the result."""
    from recurlen import Mamba2LM
    from recurlen.models import causal_conv
    from recurlen.training.lit_module import head_token_loss
    from recurlen.training.optim import OptimConfig, build_optimizer

    cuda = device == "cuda"
    torch.manual_seed(0)
    model = Mamba2LM(recurlen_config(shape), backend="kernel").to(device)
    fused_conv = cuda and causal_conv._causal_conv1d() is not None
    peer = peer_model(model, fused_conv=fused_conv)
    vocab = model.config.vocab_size
    g = torch.Generator(device=device).manual_seed(1)
    ids = torch.randint(0, vocab, (batch, length + 1), device=device, generator=g)
    inputs, targets = ids[:, :-1], ids[:, 1:]
    params = model.num_parameters()
    result: dict = {"shape": shape, "batch": batch, "length": length, "tokens_per_step": batch * length,
                    "parameters": params, "device": torch.cuda.get_device_name() if cuda else "cpu",
                    "precision": "bf16 autocast" if cuda else "float32", "mamba_ssm_fused_conv_scan": fused_conv,
                    "recurlen_head_loss": head_loss,
                    "rounds_done": 0}

    with torch.no_grad():  # the same function first: float32, no autocast, a short input
        short = inputs[:1, : min(length, 4 * model.config.chunk_size + 3)]
        ours = model(short, backend="kernel")[0]
        theirs = peer(short).logits[..., :vocab]
        rel = float((ours - theirs).abs().max() / theirs.abs().max().clamp_min(1e-12))
    result["same_function"] = {"logits_rel_diff": rel, "tolerance": AGREE_TOL, "ok": rel <= AGREE_TOL}

    recurlen_opt = build_optimizer(model, OptimConfig(), total_steps=1)[0]
    peer_opt = build_optimizer(peer, OptimConfig(), total_steps=1)[0]

    def autocast():
        return torch.autocast("cuda", dtype=torch.bfloat16) if cuda else torch.autocast("cpu", enabled=False)

    def recurlen_step(mode: str) -> Callable[[], None]:
        def step() -> None:
            with autocast():
                hidden, _ = model.forward_hidden(inputs, backend="kernel")
                loss = head_token_loss(model, hidden, targets, None, mode=mode)
            loss.backward()
            recurlen_opt.step()
            recurlen_opt.zero_grad(set_to_none=True)
        return step

    def peer_step() -> None:
        with autocast():
            logits = peer(inputs).logits
            loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        loss.backward()
        peer_opt.step()
        peer_opt.zero_grad(set_to_none=True)

    steps = {"recurlen": (recurlen_step(head_loss), model, recurlen_opt),
             "recurlen_plain_loss": (recurlen_step("plain"), model, recurlen_opt),
             "mamba_ssm": (peer_step, peer, peer_opt)}
    times: dict[str, list[float]] = {name: [] for name in steps}
    peaks: dict[str, int] = {name: 0 for name in steps}
    failed: dict[str, str] = {}

    def run(name: str, timed: bool) -> None:
        fn, owner, opt = steps[name]
        own = resident_bytes(owner, opt)
        if cuda:
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            peak = own + torch.cuda.max_memory_allocated() - before
        else:
            from bench_memory import TensorPeak

            existing = [*owner.parameters(), *(t for s in opt.state.values() for t in s.values()
                                               if isinstance(t, torch.Tensor)), ids]
            start = time.perf_counter()
            with TensorPeak(existing) as counted:
                fn()
            seconds = time.perf_counter() - start
            peak = own + counted.peak
        if timed:
            times[name].append(seconds)
            peaks[name] = max(peaks[name], peak)

    def attempt(name: str, timed: bool) -> None:
        if name in failed:
            return
        try:
            run(name, timed)
        except torch.cuda.OutOfMemoryError as err:  # one peer out of memory: the others are still measured
            failed[name] = f"out of memory: {str(err).splitlines()[0][:200]}"
            steps[name][2].zero_grad(set_to_none=True)  # what the failed step left must not weigh on the others
            if cuda:
                torch.cuda.empty_cache()

    names = list(steps)
    for _ in range(warmup):
        for name in names:
            attempt(name, timed=False)
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            attempt(name, timed=True)
        result["rounds_done"] = r + 1
        summarise(result, times, peaks, failed, params=params, tokens=batch * length)
        report(result)
    peak_flops, peak_dtype = measured_matmul_peak(device)
    named = bf16_peak_flops(result["device"]) if cuda else None
    result["matmul_peak"] = {"measured_tflops": sig(peak_flops / 1e12), "dtype": peak_dtype,
                             "data_sheet_bf16_tflops": None if named is None else named / 1e12}
    denominator = named or peak_flops
    for row in result["peers"].values():
        if row.get("tokens_per_s"):
            row["mfu"] = sig(6 * params * row["tokens_per_s"] / denominator)
    result["mfu_denominator"] = "data sheet bf16 dense peak" if named else f"measured {peak_dtype} matmul peak"
    report(result)
    return result


def sig(x: float, digits: int = 4) -> float:
    """x to `digits` significant digits (the JSON's numbers, from GiB on a GPU to MiB on a CPU rehearsal)."""
    return float(f"{x:.{digits}g}")


def summarise(result: dict, times: dict[str, list[float]], peaks: dict[str, int], failed: dict[str, str], *,
              params: int, tokens: int) -> None:
    rows: dict[str, dict] = {}
    for name, seconds in times.items():
        if name in failed:
            rows[name] = {"error": failed[name]}
            continue
        if not seconds:
            continue
        median = statistics.median(seconds)
        rows[name] = {"tokens_per_s": sig(tokens / median), "step_ms_median": sig(1e3 * median),
                      "step_ms": [sig(1e3 * s) for s in seconds], "peak_gib": sig(peaks[name] / 2**30),
                      "peak_bytes": peaks[name]}
    result["peers"] = rows
    ours, theirs = rows.get("recurlen", {}), rows.get("mamba_ssm", {})
    if ours.get("tokens_per_s") and theirs.get("tokens_per_s"):
        speed = statistics.median(times["mamba_ssm"]) / statistics.median(times["recurlen"])
        memory = peaks["recurlen"] / peaks["mamba_ssm"]
        result["recurlen_vs_mamba_ssm"] = {
            "tokens_per_s_ratio": round(speed, 3), "peak_memory_ratio": round(memory, 3),
            "target": f"tokens/s >= {TOKENS_PER_S_TARGET}x and peak memory <= {MEMORY_TARGET}x",
            "met": speed >= TOKENS_PER_S_TARGET and memory <= MEMORY_TARGET}
    plain = rows.get("recurlen_plain_loss", {})
    if ours.get("peak_gib") and plain.get("peak_gib"):
        result["chunked_loss_memory_ratio"] = round(peaks["recurlen"] / peaks["recurlen_plain_loss"], 3)


__all__ = ["SHAPES", "compare_train_step", "import_mamba_lm", "peer_model"]
