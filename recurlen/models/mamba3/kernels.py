"""Optional kernel: mamba-ssm's Triton Mamba-3 SISO scan (`mamba3_siso_combined`), with the state in and out.

Nothing here is imported at module load time: importing any `mamba_ssm` submodule runs the package `__init__`,
which loads Mamba-1's CUDA extension. The import happens inside a function, the first time the kernel backend is
asked for; a build without the CUDA extensions (`MAMBA_SKIP_CUDA_BUILD=TRUE`) has a package `__init__` that fails,
so the Triton module is then imported without running it.

The kernel computes in bfloat16 where mamba-ssm chose to: it casts q, k, v, the trapezoid's weight, the angles and
z to bf16 (dt, A dt, the biases, D and the states stay float32), so on CUDA its outputs agree with the float32
PyTorch path to bf16 precision, not float32's.
"""

from __future__ import annotations

import functools
import importlib.util

import torch

from recurlen.models.backends import KernelPath, import_without_failing_init
from recurlen.models.mamba3.scan import Mamba3Parts
from recurlen.models.resets import Varlen

INSTALL_CUDA = "pip install 'recurlen[cuda]' (on a CUDA machine; make install EXTRAS=dev,cuda TORCH_CPU=torch)"
INSTALL_TRITON_ONLY = ("MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE pip install --no-build-isolation --no-deps "
                       "mamba-ssm einops triton")
MODULE = "mamba_ssm.ops.triton.mamba3.mamba3_siso_combined"


def _import_siso():
    return importlib.import_module(MODULE).mamba3_siso_combined


@functools.lru_cache(maxsize=1)
def _mamba3_kernel():
    return import_without_failing_init("mamba_ssm", _import_siso, "its Triton Mamba-3 kernel")


# `load` looks the importer up at call time (tests replace it).
KERNELS = KernelPath(what="mamba-ssm's Triton Mamba-3 kernel", load=lambda: _mamba3_kernel(), install_cuda=INSTALL_CUDA,
                     install_cpu=f"make test-kernels (pip install 'recurlen[kernels-cpu]' then {INSTALL_TRITON_ONLY})")


def siso_kernel(
    q_BLGN: torch.Tensor,
    k_BLGN: torch.Tensor,
    v_BLHP: torch.Tensor,
    adt_BLH: torch.Tensor,
    dt_BLH: torch.Tensor,
    trap_BLH: torch.Tensor,
    angles_BLHS: torch.Tensor,
    q_bias_HN: torch.Tensor,
    k_bias_HN: torch.Tensor,
    *,
    D: torch.Tensor,
    z: torch.Tensor | None,
    chunk_size: int,
    initial: Mamba3Parts,
    resets_BL: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Mamba3Parts]:
    """mamba3_chunked's inputs -> y with the D skip and silu(z) (when z is given), and the final state (ssm, angle,
    k, v) in float32. trap and angles are raw, as for the PyTorch path. With `resets_BL` (documents packed in the
    rows, recurlen.models.resets) the rows go in as the kernel's varlen sequences (`cu_seqlens`, batch 1): each row's
    first document from the row's state, the others from zeros; each row's last document's state comes back."""
    fn, _ = _mamba3_kernel()
    ssm, angle, k, v = initial
    z_BLHP = None if z is None else z.unflatten(-1, v_BLHP.shape[-2:])
    states = (angle.float(), ssm.float(), k.float(), v.float())
    per_token = [q_BLGN, k_BLGN, v_BLHP, adt_BLH, dt_BLH, trap_BLH, angles_BLHS, z_BLHP]
    varlen = None
    if resets_BL is not None:
        varlen = Varlen.of(resets_BL)
        per_token = [None if t is None else Varlen.flatten(t) for t in per_token]
        states = tuple(varlen.initial(t) for t in states)
    q, k_in, v_in, adt, dt, trap, angles, z_in = per_token
    y, angle, ssm, k, v = fn(
        q, k_in, v_in, adt.transpose(1, 2).float(), dt.transpose(1, 2).float(), trap.transpose(1, 2),
        q_bias_HN.float(), k_bias_HN.float(), angles.float(), D=D.float(), Z=z_in,
        Input_States=tuple(t.contiguous() for t in states), chunk_size=chunk_size, return_final_states=True,
        **({} if varlen is None else {"cu_seqlens": varlen.cu_seqlens.int()}))
    finals = (ssm.float(), angle.float(), k.float(), v.float())
    if varlen is not None:
        y = y.view(*resets_BL.shape, *y.shape[2:])
        finals = tuple(t.index_select(0, varlen.last) for t in finals)
    return y, finals


__all__ = ["KERNELS", "siso_kernel"]
