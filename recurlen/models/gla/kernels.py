"""Optional GPU path for GLA: flash-linear-attention's chunked GLA kernel (Triton).

`fla.ops.gla.chunk_gla` takes an initial state (N, H, K, V) and returns the final one, in the
(B, T, H, K) layout recurlen uses. Nothing from fla is imported at module load time; its keyword
arguments changed across releases (`head_first` was the default layout once, `state_v_first` came
later), so the call passes each only where the installed version has it, always asking for the
time-major layout and the key-major state (recurlen.models.fla_model's glue, shared by fla's layouts).

On CPU tensors the same kernel runs only under Triton's interpreter (TRITON_INTERPRET=1 before triton
is imported, with recurlen[kernels-cpu] and fla-core): the kernel tests use it to execute this glue
without a GPU (make test-kernels).
"""

from __future__ import annotations

import torch

from recurlen.models.backends import KernelPath
from recurlen.models.fla_model import FLA_INSTALL_CPU, FLA_INSTALL_CUDA, cached_loader, layout_kwargs, run_chunked

_chunk_gla = cached_loader("fla.ops.gla", "chunk_gla")

KERNELS = KernelPath(what="flash-linear-attention's chunk_gla (Triton)", load=lambda: _chunk_gla(),
                     install_cuda=FLA_INSTALL_CUDA, install_cpu=FLA_INSTALL_CPU)


def kernels_available() -> bool:
    return torch.cuda.is_available() and _chunk_gla()[0] is not None


def chunk_gla(q_BLHK: torch.Tensor, k_BLHK: torch.Tensor, v_BLHV: torch.Tensor, g_BLHK: torch.Tensor, *,
              scale: float, initial_state_BHKV: torch.Tensor, resets_BL: torch.Tensor | None = None,
              fn=None) -> tuple[torch.Tensor, torch.Tensor]:
    """fla's chunk_gla with the state in and out; the final state comes back float32. With `resets_BL` the rows'
    documents go in as fla's varlen sequences (`cu_seqlens`; fla_model.run_chunked).

    `fn` replaces fla's kernel (the interpreter tests pass the same function imported under Triton's
    CPU interpreter).
    """
    # fla detaches the initial state in some releases: the state's gradient then stops here, which is
    # what state passing / TBTT want anyway (they detach), but a caller needing it must use the torch path.
    # fla-core 0.6.0 returns it (the interpreter tests compare it with the torch path's).
    return run_chunked(fn or _chunk_gla()[0], q_BLHK, k_BLHK, v_BLHV, g_BLHK.float(), scale=scale,
                       initial_state_BHKV=initial_state_BHKV, resets_BL=resets_BL)


__all__ = ["KERNELS", "chunk_gla", "kernels_available", "layout_kwargs"]
