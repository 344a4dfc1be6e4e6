"""The gated delta rule in pure PyTorch: chunked in the WY / UT form (the CPU path and the oracle) and per token.

Recurrence per (value) head, for t = 0..L-1 (S_-1 = initial state, S: (Dk, Dv), g_t <= 0, beta_t in (0, 2)):
    S_t = exp(g_t) (I - beta_t k_t k_t^T) S_t-1 + beta_t k_t v_t^T
    o_t = scale q_t^T S_t
i.e. the state is decayed, then the value it predicts for k_t is moved towards v_t by beta_t (the delta rule).

In a chunk of l positions entering with S_0, with b_t = g_0 + ... + g_t (from the chunk's start), every update
is a rank-one write of a corrected value d_s at k_s:
    S_t = exp(b_t) S_0 + sum_{s<=t} exp(b_t - b_s) k_s d_s^T,
    d_s = beta_s (v_s - exp(b_s) k_s^T S_0 - sum_{r<s} exp(b_s - b_r) (k_s . k_r) d_r).
So (I + A) d = beta v - beta exp(b) K S_0 with A strictly lower triangular, A_sr = beta_s exp(b_s - b_r) k_s . k_r.
With T = (I + A)^-1 (the UT transform, one unit-triangular solve per chunk), d = U - W S_0 where U = T (beta v)
and W = T (beta exp(b) k) depend on the chunk alone (the WY representation); only S_0 @ W crosses chunks.
Every exponent is b_later - b_earlier <= 0, so nothing overflows however strong the decay.

Legend: B batch, L length, H heads, K head key dim, V head value dim, c chunks, l chunk positions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from recurlen.models.layers import up
from recurlen.models.resets import chunk_counts, same_document


def gated_delta_chunked(
    q_BLHK: torch.Tensor,
    k_BLHK: torch.Tensor,
    v_BLHV: torch.Tensor,
    g_BLH: torch.Tensor,
    beta_BLH: torch.Tensor,
    *,
    scale: float,
    chunk_size: int,
    initial_state_BHKV: torch.Tensor | None = None,
    resets_BL: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked gated delta rule; g are log decays (<= 0). Returns o (B, L, H, V) and the final state (B, H, K, V).
    With `resets_BL` (True where a document starts) S is zero before each flagged position: the corrected values,
    the outputs and the state at a chunk's end read only their own document's writes, and S_0 only up to the chunk's
    first flag (recurlen.models.resets)."""
    batch, length, nheads, dk = q_BLHK.shape
    dv = v_BLHV.shape[-1]
    # float32 inside (float64 stays float64): the decays are products of many numbers in (0, 1].
    q, k, v = (up(t).transpose(1, 2) for t in (q_BLHK, k_BLHK, v_BLHV))
    g, beta = (up(t).transpose(1, 2) for t in (g_BLH, beta_BLH))
    l = max(1, min(chunk_size, length))
    # Pad the end: padded steps have g = 0 (decay 1) and beta = 0 (no write), so the final state is untouched.
    pad = (-length) % l
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        g, beta = (F.pad(t, (0, pad)) for t in (g, beta))
    c = (length + pad) // l
    q, k, v = (t.reshape(batch, nheads, c, l, t.shape[-1]) for t in (q, k, v))
    g, beta = (t.reshape(batch, nheads, c, l) for t in (g, beta))

    b = g.cumsum(dim=-1)  # (B, H, c, l): log decay from the chunk's start through t
    # exp(b_t - b_s) for s <= t; above the diagonal the exponent is positive and masked: clamp so it cannot overflow.
    decay_ts = torch.exp((b.unsqueeze(-1) - b.unsqueeze(-2)).clamp(max=0.0))
    # Flags so far in each chunk (B, 1, c, l): pairs of one document agree; 0 where S_0 is still read.
    counts = None if resets_BL is None else chunk_counts(resets_BL, pad, l).unsqueeze(1)
    reads_in = torch.exp(b)
    if counts is not None:
        decay_ts = decay_ts * same_document(counts, q.dtype)
        reads_in = reads_in * (counts == 0).to(q.dtype)
    causal = torch.ones(l, l, dtype=torch.bool, device=q.device).tril()
    kk = k @ k.transpose(-1, -2)
    A = (beta.unsqueeze(-1) * kk * decay_ts).tril(-1)  # strictly lower
    eye = torch.eye(l, dtype=q.dtype, device=q.device)
    rhs = torch.cat([beta.unsqueeze(-1) * v, (beta * reads_in).unsqueeze(-1) * k], dim=-1)
    uw = torch.linalg.solve_triangular(A + eye, rhs, upper=False, unitriangular=True)
    U, W = uw.split([dv, dk], dim=-1)  # (B, H, c, l, V), (B, H, c, l, K)

    scores = (q @ k.transpose(-1, -2)) * decay_ts * causal  # (B, H, c, l, l)
    q_in = q * reads_in.unsqueeze(-1)  # queries reading the state that entered the chunk
    to_end = torch.exp(b[..., -1:] - b)
    decay_chunk = torch.exp(b[..., -1])
    if counts is not None:  # only the chunk's last document reaches its end; a flag ends the entering state
        to_end = to_end * (counts == counts[..., -1:]).to(q.dtype)
        decay_chunk = decay_chunk * (counts[..., -1] == 0).to(q.dtype)
    k_out = k * to_end.unsqueeze(-1)  # keys as they stand at the chunk's end
    decay_chunk = decay_chunk.unsqueeze(-1).unsqueeze(-1)  # (B, H, c, 1, 1)
    state = q.new_zeros(batch, nheads, dk, dv) if initial_state_BHKV is None else initial_state_BHKV.to(q.dtype)
    outs = []
    for i in range(c):
        d = U[:, :, i] - W[:, :, i] @ state  # the corrected values written in this chunk
        outs.append(q_in[:, :, i] @ state + scores[:, :, i] @ d)
        state = decay_chunk[:, :, i] * state + k_out[:, :, i].transpose(-1, -2) @ d
    o = torch.stack(outs, dim=2).reshape(batch, nheads, c * l, dv)[:, :, :length] * scale
    return o.transpose(1, 2), state


def gated_delta_step(q_BHK: torch.Tensor, k_BHK: torch.Tensor, v_BHV: torch.Tensor, g_BH: torch.Tensor,
                     beta_BH: torch.Tensor, *, scale: float,
                     state_BHKV: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of the recurrence (generation)."""
    dtype = state_BHKV.dtype
    q, k, v, g, beta = (t.to(dtype) for t in (q_BHK, k_BHK, v_BHV, g_BH, beta_BH))
    state = torch.exp(g)[..., None, None] * state_BHKV
    d = beta.unsqueeze(-1) * (v - (k.unsqueeze(-2) @ state).squeeze(-2))
    state = state + k.unsqueeze(-1) * d.unsqueeze(-2)
    return ((q * scale).unsqueeze(-2) @ state).squeeze(-2), state


__all__ = ["gated_delta_chunked", "gated_delta_step"]
