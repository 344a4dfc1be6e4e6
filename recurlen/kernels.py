"""Optional CUDA kernels: mamba-ssm's Triton SSD scan and gated RMSNorm, causal-conv1d's conv.

Nothing here is imported at module load time: importing any `mamba_ssm` submodule runs the package
`__init__`, which loads a CUDA extension. Every import happens inside a function, the first time
the kernel backend is asked for, and a missing or broken install is reported once, clearly.
"""

from __future__ import annotations

import functools
import logging

import torch

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=1)
def _mamba_kernels():
    try:
        from mamba_ssm.ops.triton.layernorm_gated import rmsnorm_fn
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
    except Exception as err:  # ImportError, or a CUDA extension that fails to load
        return None, f"{type(err).__name__}: {err}"
    return (mamba_chunk_scan_combined, rmsnorm_fn), None


@functools.lru_cache(maxsize=1)
def _causal_conv1d():
    try:
        from causal_conv1d import causal_conv1d_fn
    except Exception as err:
        log.info("causal-conv1d not usable (%s); the kernel backend uses the PyTorch conv", err)
        return None
    return causal_conv1d_fn


def kernels_available() -> bool:
    """True when CUDA is present and mamba-ssm's Triton kernels import."""
    return torch.cuda.is_available() and _mamba_kernels()[0] is not None


def require_kernels() -> None:
    if not torch.cuda.is_available():
        raise ValueError("backend='kernel' needs a CUDA device; use backend='torch' (or 'auto') on CPU")
    fns, why = _mamba_kernels()
    if fns is None:
        raise ValueError(
            "backend='kernel' needs mamba-ssm (pip install 'recurlen[cuda]'); importing it failed with "
            f"{why}. Use backend='torch' or 'auto'."
        )


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
) -> tuple[torch.Tensor, torch.Tensor]:
    """SSD with the D skip; dt is raw (softplus(dt + dt_bias) happens inside the kernel)."""
    (scan, _), _ = _mamba_kernels()
    y, final = scan(
        x_BLHP, dt_raw_BLH, A_H, B_BLGN, C_BLGN, chunk_size,
        D=D_H, z=None, dt_bias=dt_bias_H, initial_states=initial_state_BHPN,
        dt_softplus=True, dt_limit=dt_limit, return_final_states=True,
    )
    return y, final.float()


def gated_rmsnorm_kernel(y: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, *, eps: float, group_size: int):
    (_, rmsnorm_fn), _ = _mamba_kernels()
    return rmsnorm_fn(y, weight, None, z=z, eps=eps, group_size=group_size, norm_before_gate=False)


def causal_conv_kernel(xBC_BLC: torch.Tensor, weight_CK: torch.Tensor, bias_C: torch.Tensor | None,
                       conv_state_BCW: torch.Tensor):
    """Conv + SiLU with initial/final states, or None when causal-conv1d is not installed."""
    fn = _causal_conv1d()
    if fn is None:
        return None
    # causal-conv1d takes initial states only in channel-last layout (stride 1 over channels), with the
    # other strides multiples of 8. xBC is a column slice of in_proj's output: made contiguous its
    # strides are (L*C, C, 1), so the channel count decides; otherwise the PyTorch conv does the work.
    if xBC_BLC.shape[-1] % 8:
        return None
    x_BCL = xBC_BLC.contiguous().transpose(1, 2)
    init_BCW = conv_state_BCW.to(xBC_BLC.dtype).transpose(1, 2).contiguous().transpose(1, 2)
    out_BCL, final_BCW = fn(x_BCL, weight_CK, bias_C, initial_states=init_BCW, return_final_states=True,
                            activation="silu")
    return out_BCL.transpose(1, 2), final_BCW
