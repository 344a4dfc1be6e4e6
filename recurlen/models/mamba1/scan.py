"""Mamba-1's selective scan in pure PyTorch, chunk by chunk, with the initial state in and the final state out.

Recurrence per channel d and state entry n, for t = 0..L-1 (h_{-1} = initial state):
    h_t[d, n] = exp(dt_t[d] A[d, n]) h_t-1[d, n] + dt_t[d] x_t[d] B_t[n]
    y_t[d]    = sum_n h_t[d, n] C_t[n]
(the D skip and the z gate live in the mixer; dt is already positive).

Why not Mamba-2's matmul form: there every head has one scalar decay per step, so a chunk is an
(l x l) masked attention. Mamba-1's decay differs per (d, n), so that matrix would be (l x l x D x N),
and the cumsum/exp factorisation overflows for strong decays. This scan stays exact and stable:
per chunk of l steps, the decays and inputs are formed in one vectorised pass each, the l state
updates are one in-place multiply-add per step on a (B, D, N) slice that stays in cache, and the
outputs are one batched matmul. The backward is written out: it recomputes each chunk's states from
the state saved at the chunk's start (memory O(L D) per layer, not O(L D N)), runs the adjoint
recurrence backwards (again one multiply-add per step), and forms every gradient in vectorised passes.

Legend: B batch, L length, D channels (d_inner), N d_state, l chunk positions.
"""

from __future__ import annotations

import torch

from recurlen.models.layers import up


def _chunk_inputs(x_lBD, dt_lBD, A_DN, B_lBN, keep_lB=None):
    """Per step decay exp(dt A) and input dt x B, both (l, B, D, N), contiguous per step. keep_lB: 0 where a
    document starts (the decay of the state before it is cut to zero: h_t = dt x B there)."""
    dA = torch.exp(dt_lBD.unsqueeze(-1) * A_DN)
    if keep_lB is not None:
        dA = dA * keep_lB[..., None, None]
    u = (dt_lBD * x_lBD).unsqueeze(-1) * B_lBN.unsqueeze(2)
    return dA, u


def _run_states(dA_lBDN: torch.Tensor, u_lBDN: torch.Tensor, h_BDN: torch.Tensor) -> torch.Tensor:
    """h_t = dA_t h_t-1 + u_t for the chunk, in place in u (which becomes the states h_0..h_l-1)."""
    prev = h_BDN
    for i in range(u_lBDN.shape[0]):
        u_lBDN[i].addcmul_(dA_lBDN[i], prev)
        prev = u_lBDN[i]
    return u_lBDN


class _SelectiveScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x_BLD, dt_BLD, A_DN, B_BLN, C_BLN, h0_BDN, chunk_size: int, resets_BL=None):
        dtype = torch.promote_types(x_BLD.dtype, torch.float32)
        x, dt, B, C = (t.to(dtype).transpose(0, 1).contiguous() for t in (x_BLD, dt_BLD, B_BLN, C_BLN))
        keep = None if resets_BL is None else (~resets_BL).to(dtype).t().contiguous()  # (L, B)
        ctx.keep = keep
        A, h = A_DN.to(dtype), h0_BDN.to(dtype)
        length = x.shape[0]
        y_LBD = x.new_empty(x.shape)
        starts = []
        for a in range(0, length, chunk_size):
            b = min(a + chunk_size, length)
            starts.append(h)
            dA, u = _chunk_inputs(x[a:b], dt[a:b], A, B[a:b], None if keep is None else keep[a:b])
            hs = _run_states(dA, u, h)
            torch.matmul(hs, C[a:b].unsqueeze(-1), out=y_LBD[a:b].unsqueeze(-1))
            h = hs[-1].clone()
        ctx.save_for_backward(x, dt, A, B, C, torch.stack(starts))
        ctx.chunk_size = chunk_size
        ctx.in_dtypes = (x_BLD.dtype, dt_BLD.dtype, A_DN.dtype, B_BLN.dtype, C_BLN.dtype, h0_BDN.dtype)
        return y_LBD.transpose(0, 1), h

    @staticmethod
    def backward(ctx, gy_BLD, gh_BDN):
        x, dt, A, B, C, starts = ctx.saved_tensors
        chunk_size = ctx.chunk_size
        length = x.shape[0]
        gy = gy_BLD.to(x.dtype).transpose(0, 1).contiguous()
        carry = gh_BDN.to(x.dtype) if gh_BDN is not None else torch.zeros_like(starts[0])
        gx, gdt, gB, gC = (torch.empty_like(t) for t in (x, dt, B, C))
        gA = torch.zeros_like(A)
        bounds = [(a, min(a + chunk_size, length)) for a in range(0, length, chunk_size)]
        for k in reversed(range(len(bounds))):
            a, b = bounds[k]
            h_start = starts[k]
            dA, u = _chunk_inputs(x[a:b], dt[a:b], A, B[a:b], None if ctx.keep is None else ctx.keep[a:b])
            hs = _run_states(dA, u, h_start)
            # y_t = h_t . C_t  ->  dC_t = sum_d gy_t[d] h_t[d, :]
            gC[a:b] = (gy[a:b].unsqueeze(-2) @ hs).squeeze(-2)
            # Adjoint recurrence G_t = gy_t C_t + dA_t+1 G_t+1, run backwards in place.
            G = gy[a:b].unsqueeze(-1) * C[a:b].unsqueeze(2)
            G[-1] += carry
            for i in range(b - a - 2, -1, -1):
                G[i].addcmul_(dA[i + 1], G[i + 1])
            carry = dA[0] * G[0]  # gradient w.r.t. the state entering this chunk
            # u = dt x B: d(dt x) = sum_n G B, dB = sum_d dt x G.
            gu_xB = (G @ B[a:b].unsqueeze(-1)).squeeze(-1)
            gB[a:b] = ((dt[a:b] * x[a:b]).unsqueeze(-2) @ G).squeeze(-2)
            # h_t = dA_t h_t-1 + u_t: d(dt A)_t = G_t h_t-1 dA_t (in place: G is not needed any more).
            G[1:].mul_(hs[:-1])
            G[0].mul_(h_start)
            g_logdA = G.mul_(dA)
            gA += (g_logdA * dt[a:b].unsqueeze(-1)).sum(dim=(0, 1))
            g_dt = (g_logdA * A).sum(-1)
            gx[a:b] = gu_xB * dt[a:b]
            gdt[a:b] = g_dt + gu_xB * x[a:b]
        dts = ctx.in_dtypes
        grads = [g.transpose(0, 1).to(d) for g, d in zip((gx, gdt), dts[:2])]
        return (*grads, gA.to(dts[2]), gB.transpose(0, 1).to(dts[3]), gC.transpose(0, 1).to(dts[4]),
                carry.to(dts[5]), None, None)


def selective_scan_chunked(
    x_BLD: torch.Tensor,
    dt_BLD: torch.Tensor,
    A_DN: torch.Tensor,
    B_BLN: torch.Tensor,
    C_BLN: torch.Tensor,
    *,
    chunk_size: int,
    initial_state_BDN: torch.Tensor | None = None,
    resets_BL: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """y (B, L, D) and the final state (B, D, N), in float32 (float64 inputs stay float64). With `resets_BL` (True
    where a document starts) the state is zero before each flagged position."""
    batch, _, d_inner = x_BLD.shape
    if initial_state_BDN is None:
        initial_state_BDN = x_BLD.new_zeros(batch, d_inner, A_DN.shape[1], dtype=up(x_BLD).dtype)
    return _SelectiveScan.apply(x_BLD, dt_BLD, A_DN, B_BLN, C_BLN, initial_state_BDN, max(1, chunk_size), resets_BL)


def selective_scan_step(x_BD: torch.Tensor, dt_BD: torch.Tensor, A_DN: torch.Tensor, B_BN: torch.Tensor,
                        C_BN: torch.Tensor, state_BDN: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of the recurrence (generation)."""
    dtype = state_BDN.dtype
    x, dt, A, B, C = (t.to(dtype) for t in (x_BD, dt_BD, A_DN, B_BN, C_BN))
    state = torch.exp(dt.unsqueeze(-1) * A) * state_BDN + (dt * x).unsqueeze(-1) * B.unsqueeze(1)
    return (state @ C.unsqueeze(-1)).squeeze(-1), state


__all__ = ["selective_scan_chunked", "selective_scan_step"]
