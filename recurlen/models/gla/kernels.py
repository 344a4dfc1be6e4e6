"""Optional GPU path for GLA: flash-linear-attention's chunked GLA kernel (Triton).

`fla.ops.gla.chunk_gla` takes an initial state (N, H, K, V) and returns the final one, in the
(B, T, H, K) layout recurlen uses. Nothing from fla is imported at module load time; its keyword
arguments changed across releases (`head_first` was the default layout once, `state_v_first` came
later), so the call passes each only where the installed version has it, always asking for the
time-major layout and the key-major state.

On CPU tensors the same kernel runs only under Triton's interpreter (TRITON_INTERPRET=1 before triton
is imported, with recurlen[kernels-cpu] and fla-core): the kernel tests use it to execute this glue
without a GPU (make test-kernels).
"""

from __future__ import annotations

import functools
import inspect

import torch

from recurlen.models.backends import KernelPath


@functools.lru_cache(maxsize=1)
def _chunk_gla():
    try:
        from fla.ops.gla import chunk_gla
    except Exception as err:  # ImportError, or Triton failing to initialise
        return None, f"{type(err).__name__}: {err}"
    return chunk_gla, None


KERNELS = KernelPath(what="flash-linear-attention's chunk_gla (Triton)", load=lambda: _chunk_gla(),
                     install_cuda="pip install 'recurlen[gla]'", install_cpu="make test-kernels installs fla-core")


def kernels_available() -> bool:
    return torch.cuda.is_available() and _chunk_gla()[0] is not None


def layout_kwargs(fn) -> dict:
    """Keyword arguments that pin fla's layout: (B, T, H, K) inputs, (N, H, K, V) states."""
    params = inspect.signature(fn).parameters
    kwargs = {}
    if "head_first" in params:
        kwargs["head_first"] = False
    if "state_v_first" in params:
        kwargs["state_v_first"] = False
    return kwargs


def chunk_gla(q_BLHK: torch.Tensor, k_BLHK: torch.Tensor, v_BLHV: torch.Tensor, g_BLHK: torch.Tensor, *,
              scale: float, initial_state_BHKV: torch.Tensor, fn=None) -> tuple[torch.Tensor, torch.Tensor]:
    """fla's chunk_gla with the state in and out; the final state comes back float32.

    `fn` replaces fla's kernel (the interpreter tests pass the same function imported under Triton's
    CPU interpreter).
    """
    fn = fn or _chunk_gla()[0]
    # fla detaches the initial state in some releases: the state's gradient then stops here, which is
    # what state passing / TBTT want anyway (they detach), but a caller needing it must use the torch path.
    # fla-core 0.6.0 returns it (the interpreter tests compare it with the torch path's).
    o, final = fn(q_BLHK, k_BLHK, v_BLHV, g_BLHK.float(), scale=scale,
                  initial_state=initial_state_BHKV.float().contiguous(), output_final_state=True, **layout_kwargs(fn))
    return o, final.float()


__all__ = ["KERNELS", "chunk_gla", "kernels_available", "layout_kwargs"]
