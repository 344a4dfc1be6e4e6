"""Optional kernels: mamba-ssm's Triton SSD scan and gated RMSNorm, causal-conv1d's conv.

Nothing here is imported at module load time: importing any `mamba_ssm` submodule runs the package
`__init__`, which loads Mamba-1's CUDA extension. Every import happens inside a function, the first time
the kernel backend is asked for, and a missing or broken install is reported once, clearly.

Mamba-2 needs only mamba-ssm's Triton kernels. A build without its CUDA extensions
(`MAMBA_SKIP_CUDA_BUILD=TRUE`, seconds instead of a long compile) has a package `__init__` that fails on
the missing Mamba-1 extension, so the Triton modules are then imported without running it.

Where each path runs:
  CUDA tensors                 Triton scan + gated RMSNorm; causal-conv1d's conv when it is installed,
                               the PyTorch conv otherwise.
  CPU tensors, Triton's        the same Triton scan and RMSNorm, executed by the interpreter (numpy); the
  interpreter on               conv takes the PyTorch path (causal-conv1d is CUDA-only). The kernel tests
  (TRITON_INTERPRET=1)         use this to execute the real kernel glue on a machine without a GPU.
"""

from __future__ import annotations

import functools

import torch

from recurlen.models.backends import KernelPath, import_without_failing_init

INSTALL_CUDA = "pip install 'recurlen[cuda]' (on a CUDA machine; make install EXTRAS=dev,cuda TORCH_CPU=torch)"
INSTALL_TRITON_ONLY = ("MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE pip install --no-build-isolation --no-deps "
                       "mamba-ssm einops triton")


def _import_triton_ops():
    from mamba_ssm.ops.triton.layernorm_gated import rmsnorm_fn
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined

    return mamba_chunk_scan_combined, rmsnorm_fn


@functools.lru_cache(maxsize=1)
def _mamba_kernels():
    return import_without_failing_init("mamba_ssm", _import_triton_ops, "its Triton kernels")


# `load` looks the importer up at call time (tests replace it).
KERNELS = KernelPath(what="mamba-ssm's Triton kernels", load=lambda: _mamba_kernels(), install_cuda=INSTALL_CUDA,
                     install_cpu=f"make test-kernels (pip install 'recurlen[kernels-cpu]' then {INSTALL_TRITON_ONLY})")


def kernels_available() -> bool:
    """True when CUDA is present and mamba-ssm's Triton kernels import."""
    return torch.cuda.is_available() and _mamba_kernels()[0] is not None


def ssd_kernel(
    x_BLHP: torch.Tensor,
    dt_raw_BLH: torch.Tensor,
    A_H: torch.Tensor,
    B_BLGN: torch.Tensor,
    C_BLGN: torch.Tensor,
    *,
    chunk_size: int,
    D_H: torch.Tensor,
    dt_bias_H: torch.Tensor,
    dt_limit: tuple[float, float],
    initial_state_BHPN: torch.Tensor,
    seq_idx_BL: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SSD with the D skip; dt is raw (softplus(dt + dt_bias) happens inside the kernel). `seq_idx_BL`: the document
    index of each position (recurlen.models.resets.seq_idx; the initial state belongs to document 0): the kernel
    resets the state where it changes."""
    (scan, _), _ = _mamba_kernels()
    y, final = scan(
        x_BLHP, dt_raw_BLH, A_H, B_BLGN, C_BLGN, chunk_size,
        D=D_H, z=None, dt_bias=dt_bias_H, initial_states=initial_state_BHPN, seq_idx=seq_idx_BL,
        dt_softplus=True, dt_limit=dt_limit, return_final_states=True,
    )
    return y, final.float()


def gated_rmsnorm_kernel(y: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, *, eps: float, group_size: int):
    (_, rmsnorm_fn), _ = _mamba_kernels()
    return rmsnorm_fn(y, weight, None, z=z, eps=eps, group_size=group_size, norm_before_gate=False)


__all__ = ["KERNELS", "gated_rmsnorm_kernel", "kernels_available", "ssd_kernel"]
