"""Optional GPU path for RWKV-6: flash-linear-attention's chunked WKV-6 kernel (Triton).

`fla.ops.rwkv6.chunk_rwkv6(r, k, v, w, u, scale, initial_state, output_final_state)` takes log decays w (B, T, H, K),
the bonus u (H, K) and an initial state (N, H, K, V), and returns the final one: the same recurrence as
recurlen.models.rwkv6.scan with scale 1. Nothing from fla is imported at module load time; a `head_first` keyword
(older releases' default layout) is pinned to the time-major layout only where the installed version has it
(recurlen.models.fla_model's glue, shared with GLA).

On CPU tensors the kernel runs only under Triton's interpreter (TRITON_INTERPRET=1 before triton is imported, with
recurlen[kernels-cpu] and fla-core): the kernel tests use it to execute this glue without a GPU (make test-kernels).
"""

from __future__ import annotations

import torch

from recurlen.models.backends import KernelPath
from recurlen.models.fla_model import FLA_INSTALL_CPU, FLA_INSTALL_CUDA, cached_loader, layout_kwargs, run_chunked

_chunk_rwkv6 = cached_loader("fla.ops.rwkv6", "chunk_rwkv6")

KERNELS = KernelPath(what="flash-linear-attention's chunk_rwkv6 (Triton)", load=lambda: _chunk_rwkv6(),
                     install_cuda=FLA_INSTALL_CUDA, install_cpu=FLA_INSTALL_CPU)


def chunk_rwkv6(r_BLHK: torch.Tensor, k_BLHK: torch.Tensor, v_BLHV: torch.Tensor, logw_BLHK: torch.Tensor,
                u_HK: torch.Tensor, *, initial_state_BHKV: torch.Tensor, resets_BL: torch.Tensor | None = None,
                fn=None) -> tuple[torch.Tensor, torch.Tensor]:
    """fla's chunk_rwkv6 with the state in and out; the final state comes back float32. With `resets_BL` the rows'
    documents go in as fla's varlen sequences (`cu_seqlens`; fla_model.run_chunked).

    `fn` replaces fla's kernel (the interpreter tests pass the same function imported under Triton's CPU
    interpreter)."""
    return run_chunked(fn or _chunk_rwkv6()[0], r_BLHK, k_BLHK, v_BLHV, logw_BLHK.float(), u=u_HK.to(r_BLHK.dtype),
                       scale=1.0, initial_state_BHKV=initial_state_BHKV, resets_BL=resets_BL)


__all__ = ["KERNELS", "chunk_rwkv6", "layout_kwargs"]
