"""Building blocks every architecture may use: precision, norms, initialisers and the pre-norm residual block.

None of them belongs to one architecture (as in fla's `modules/`): Mamba-1 and Mamba-2 share the block and the
A / dt initialisers, GLA its norm.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def up(t: torch.Tensor) -> torch.Tensor:
    """At least float32 (float64 stays float64, so the oracle can run in double precision)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # F.rms_norm is one fused kernel (forward and backward) instead of five elementwise passes.
        return F.rms_norm(up(x), (x.shape[-1],), up(self.weight), self.eps).to(self.weight.dtype)


class GatedRMSNorm(nn.Module):
    """rmsnorm(y * silu(z)) per group of d_inner/ngroups channels, times weight (norm_before_gate=False)."""

    def __init__(self, dim: int, group_size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.group_size = group_size
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        g = up(y) * F.silu(up(z))
        # F.rms_norm is one fused kernel; it normalizes the trailing group and takes a weight of
        # that shape, so with one group the weight goes in, with several it is applied after.
        if self.group_size == g.shape[-1]:
            return F.rms_norm(g, (self.group_size,), up(self.weight), self.eps).to(y.dtype)
        g_grouped = F.rms_norm(g.unflatten(-1, (-1, self.group_size)), (self.group_size,), None, self.eps)
        return (g_grouped.flatten(-2) * up(self.weight)).to(y.dtype)


def sample_A(shape, A_init_range: tuple[float, float], *, log_uniform: bool) -> torch.Tensor:
    """Decay rates A (positive; the model uses -A) sampled in A_init_range, uniformly or log-uniformly (Mamba-2's
    heads and Mamba-1's A_init_range option share it)."""
    lo, hi = A_init_range
    if log_uniform:
        return torch.exp(torch.empty(shape).uniform_(math.log(lo), math.log(hi)))
    return torch.empty(shape).uniform_(lo, hi)


def sample_dt_bias(n: int, *, dt_min: float, dt_max: float, floor: float) -> torch.Tensor:
    """mamba-ssm's dt bias: dt log-uniform in [dt_min, dt_max] (at least `floor`), stored as softplus^-1(dt)."""
    u = torch.rand(n)
    dt = torch.exp(u * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
    dt = dt.clamp(min=floor)
    return dt + torch.log(-torch.expm1(-dt))  # inverse of softplus


class ResidualBlock(nn.Module):
    """mamba-ssm's block: pre-norm, a mixer that carries a state, the residual stream kept in float32
    (residual_in_fp32). The carry between blocks is (hidden, residual): the residual add happens at the start of
    the next block, and once more after the last (`close`)."""

    def __init__(self, d_model: int, mixer: nn.Module, *, eps: float, residual_in_fp32: bool) -> None:
        super().__init__()
        self.residual_in_fp32 = residual_in_fp32
        self.norm = RMSNorm(d_model, eps=eps)
        self.mixer = mixer

    def close(self, hidden: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        residual = hidden if residual is None else hidden + residual
        return up(residual) if self.residual_in_fp32 else residual

    def forward(self, carry, parts: tuple[torch.Tensor, ...], *, use_kernels: bool,
                resets: torch.Tensor | None = None):
        residual = self.close(*carry)
        extra = {} if resets is None else {"resets": resets}  # documents packed in the row (recurlen.models.resets)
        hidden, *parts = self.mixer(self.norm(residual), *parts, use_kernels=use_kernels, **extra)
        return (hidden, residual), tuple(parts)

    def step(self, carry, parts: tuple[torch.Tensor, ...]):
        residual = self.close(*carry)
        hidden, *parts = self.mixer.step(self.norm(residual), *parts)
        return (hidden, residual), tuple(parts)


__all__ = ["GatedRMSNorm", "RMSNorm", "ResidualBlock", "sample_A", "sample_dt_bias", "up"]
