"""Optional CUDA path for Mamba-1: mamba-ssm's selective_scan_fn with the initial state folded in.

mamba-ssm's `selective_scan_fn` starts every sequence from h = 0 and returns the last state, but
takes no initial state. The scan is linear in h_{-1}, so the run from h_{-1} is the run from zero
plus the contribution of h_{-1} alone:
    y_t   += sum_n C_t[n] exp(A[d, n] cumdt_t[d]) h_{-1}[d, n]        cumdt_t = dt_0 + ... + dt_t
    h_L-1 += exp(A[d, n] cumdt_L-1[d]) h_{-1}[d, n]
`fold_initial_state` computes those terms (and their gradients) in PyTorch, chunk by chunk along L,
recomputing in the backward so that nothing (B, L, D, N)-sized is kept. Its cost is one extra
elementwise pass over (B, L, D, N) forward and two backward: about what the scan kernel itself reads.
It is pure PyTorch, so the tests check it on CPU against the float64 recurrence.

Nothing from mamba-ssm / causal-conv1d is imported at module load time (their package imports load
CUDA extensions); a missing install is reported once, clearly.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from recurlen.models.backends import KernelPath
from recurlen.models.layers import up

FOLD_CHUNK = 256


@functools.lru_cache(maxsize=1)
def _selective_scan_fn():
    try:
        from mamba_ssm.ops.selective_scan_interface import selective_scan_fn
    except Exception as err:  # ImportError, or the CUDA extension failing to load
        return None, f"{type(err).__name__}: {err}"
    return selective_scan_fn, None


KERNELS = KernelPath(what="mamba-ssm's selective_scan_fn (CUDA)", load=lambda: _selective_scan_fn(),
                     install_cuda="pip install 'recurlen[cuda]' (on a CUDA machine)")


def kernels_available() -> bool:
    return torch.cuda.is_available() and _selective_scan_fn()[0] is not None


class _FoldInitialState(torch.autograd.Function):
    """(dt, A, C, h0) -> (y0 (B, L, D), decayed h0 (B, D, N)): the initial state's share of outputs and final state."""

    @staticmethod
    def forward(ctx, dt_BLD, A_DN, C_BLN, h0_BDN, chunk: int):
        # float32 at least (float64 stays float64 for the double-precision tests).
        cumdt_BLD = up(dt_BLD).cumsum(dim=1)
        A, C, h0 = up(A_DN), up(C_BLN), up(h0_BDN)
        y0 = torch.empty_like(cumdt_BLD)
        for a in range(0, cumdt_BLD.shape[1], chunk):
            E = torch.exp(cumdt_BLD[:, a:a + chunk, :, None] * A)  # (B, l, D, N), in (0, 1]
            y0[:, a:a + chunk] = ((E * h0[:, None]) @ C[:, a:a + chunk, :, None]).squeeze(-1)
        last = torch.exp(cumdt_BLD[:, -1, :, None] * A) * h0
        ctx.save_for_backward(cumdt_BLD, A, C, h0)
        ctx.chunk = chunk
        ctx.dtypes = (dt_BLD.dtype, A_DN.dtype, C_BLN.dtype, h0_BDN.dtype)
        return y0, last

    @staticmethod
    def backward(ctx, gy_BLD, glast_BDN):
        cumdt, A, C, h0 = ctx.saved_tensors
        gy, glast = gy_BLD.to(cumdt.dtype), glast_BDN.to(cumdt.dtype)
        gC = torch.empty_like(C)
        gh0 = torch.zeros_like(h0)
        gA = torch.zeros_like(A)
        q_BLD = torch.empty_like(cumdt)  # sum_n A P_t: d loss / d cumdt_t
        for a in range(0, cumdt.shape[1], ctx.chunk):
            b = min(a + ctx.chunk, cumdt.shape[1])
            E = torch.exp(cumdt[:, a:b, :, None] * A)
            gyC = gy[:, a:b, :, None] * C[:, a:b, None, :]  # d y0_t / d (E_t h0)
            if b == cumdt.shape[1]:
                gyC[:, -1] += glast
            EgyC = E * gyC
            gh0 += EgyC.sum(dim=1)
            P = EgyC.mul_(h0[:, None])  # d loss / d (cumdt_t A)
            gA += (P * cumdt[:, a:b, :, None]).sum(dim=(0, 1))
            q_BLD[:, a:b] = (P * A).sum(-1)
            gC[:, a:b] = (gy[:, a:b, None, :] @ (E * h0[:, None])).squeeze(-2)
        # cumdt_t = dt_0 + ... + dt_t: the gradient of dt_s sums that of every cumdt_t with t >= s.
        gdt = q_BLD.flip(1).cumsum(1).flip(1)
        dt_dtype, A_dtype, C_dtype, h0_dtype = ctx.dtypes
        return gdt.to(dt_dtype), gA.to(A_dtype), gC.to(C_dtype), gh0.to(h0_dtype), None


def fold_initial_state(dt_BLD: torch.Tensor, A_DN: torch.Tensor, C_BLN: torch.Tensor, h0_BDN: torch.Tensor, *,
                       chunk: int = FOLD_CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """The initial state's contribution to y (B, L, D) and to the final state (B, D, N); dt after softplus."""
    return _FoldInitialState.apply(dt_BLD, A_DN, C_BLN, h0_BDN, chunk)


def selective_scan(x_BLI: torch.Tensor, dt_raw_BLI: torch.Tensor, A_IN: torch.Tensor, B_BLN: torch.Tensor,
                   C_BLN: torch.Tensor, *, D_I: torch.Tensor, dt_bias_I: torch.Tensor,
                   initial_state_BIN: torch.Tensor, scan_fn=None) -> tuple[torch.Tensor, torch.Tensor]:
    """selective_scan_fn from zero + the folded initial state; y includes the D skip, not the z gate.

    `scan_fn` replaces mamba-ssm's kernel (tests pass a reference with the same signature).
    """
    fn = scan_fn or _selective_scan_fn()[0]
    y_BIL, last_BIN = fn(x_BLI.transpose(1, 2).contiguous(), dt_raw_BLI.transpose(1, 2).contiguous(), A_IN,
                         B_BLN.transpose(1, 2).contiguous(), C_BLN.transpose(1, 2).contiguous(), D=D_I.float(),
                         z=None, delta_bias=dt_bias_I.float(), delta_softplus=True, return_last_state=True)
    dt_BLI = F.softplus(dt_raw_BLI.float() + dt_bias_I.float())
    y0_BLI, h0_part_BIN = fold_initial_state(dt_BLI, A_IN, C_BLN, initial_state_BIN)
    return y_BIL.transpose(1, 2).float() + y0_BLI, last_BIN.float() + h0_part_BIN


__all__ = ["KERNELS", "fold_initial_state", "kernels_available", "selective_scan"]
