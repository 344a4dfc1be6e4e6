"""Optional GPU path for RWKV-7: flash-linear-attention's chunked WKV-7 kernel (Triton).

`fla.ops.rwkv7.chunk_rwkv7(r, w, k, v, a, b, scale, initial_state, output_final_state, ...)` takes log decays w
(B, T, H, K), the rank-one vectors a = -kappa and b = kappa * alpha, and an initial state (N, H, K, V) key-major,
and returns the final one: the same recurrence as recurlen.models.rwkv7.scan with scale 1. It is called as fla's
own RWKV7Attention calls it: safe_gate with RWKV-7's decay floor (-exp(-1/2)), chunks of 64. Nothing from fla is
imported at module load time.

safe_gate is fla's centred scheme: it rescales each chunk around its middle row, so its exponents reach
|lower bound| (chunk // 2 + 1) and must stay inside float32's range. A fix that scales the decay by s > 1
(recurlen.models.timescales) moves the bound to s x -exp(-1/2): `kernel_chunk` then picks a shorter chunk, and where
none is short enough (s above ~16) the time mix runs the PyTorch scan instead.

On CPU tensors the kernel runs only under Triton's interpreter (TRITON_INTERPRET=1 before triton is imported, with
recurlen[kernels-cpu] and fla-core): the kernel tests use it to execute this glue without a GPU (make test-kernels).
"""

from __future__ import annotations

import math

import torch

from recurlen.models.backends import KernelPath
from recurlen.models.fla_model import FLA_INSTALL_CPU, FLA_INSTALL_CUDA, cached_loader, run_chunked
from recurlen.models.rwkv7.scan import LOG_DECAY_FLOOR

_chunk_rwkv7 = cached_loader("fla.ops.rwkv7", "chunk_rwkv7")

KERNELS = KernelPath(what="flash-linear-attention's chunk_rwkv7 (Triton)", load=lambda: _chunk_rwkv7(),
                     install_cuda=FLA_INSTALL_CUDA, install_cpu=FLA_INSTALL_CPU)


KERNEL_CHUNKS = (64, 32, 16)
"""The chunk lengths asked of fla, longest first (64: what fla's own layer asks for)."""
EXPONENT_LIMIT_LOG2 = 124
"""The largest exponent (base 2) the centred scheme may reach: float32's 2^128 with headroom for the products that
follow (fla's own margin for its lower_bound)."""


def kernel_chunk(lower_bound: float) -> int | None:
    """The longest of KERNEL_CHUNKS whose exponents fla's safe_gate scheme keeps inside float32 for log decays >=
    lower_bound (64 at RWKV-7's own floor); None where none does."""
    for chunk in KERNEL_CHUNKS:
        if -lower_bound * (chunk // 2 + 1) / math.log(2) <= EXPONENT_LIMIT_LOG2:
            return chunk
    return None


def chunk_rwkv7(r_BLHK: torch.Tensor, g_BLHK: torch.Tensor, k_BLHK: torch.Tensor, v_BLHV: torch.Tensor,
                a_BLHK: torch.Tensor, b_BLHK: torch.Tensor, *, initial_state_BHKV: torch.Tensor,
                resets_BL: torch.Tensor | None = None, lower_bound: float = LOG_DECAY_FLOOR, chunk_size: int = 64,
                fn=None) -> tuple[torch.Tensor, torch.Tensor]:
    """fla's chunk_rwkv7 with the state in and out; the final state comes back float32. With `resets_BL` the rows'
    documents go in as fla's varlen sequences (`cu_seqlens`; fla_model.run_chunked). `lower_bound`: the smallest log
    decay g may hold (below RWKV-7's floor only where a fix scales it), with a chunk_size kernel_chunk allows for it.

    `fn` replaces fla's kernel (a test may pass the same function imported under Triton's CPU interpreter)."""
    return run_chunked(fn or _chunk_rwkv7()[0], r_BLHK, g_BLHK.float(), k_BLHK, v_BLHV, a_BLHK, b_BLHK, scale=1.0,
                       initial_state_BHKV=initial_state_BHKV, resets_BL=resets_BL, safe_gate=True,
                       lower_bound=lower_bound, chunk_size=chunk_size)


__all__ = ["KERNELS", "KERNEL_CHUNKS", "chunk_rwkv7", "kernel_chunk"]
