"""Gated linear attention in pure PyTorch: chunked (the CPU path and the oracle) and per token.

Recurrence per head, for t = 0..L-1 (S_{-1} = initial state):
    S_t = diag(exp(g_t)) S_t-1 + k_t^T v_t          S: (Dk, Dv), g_t <= 0 per key channel
    o_t = (scale q_t) S_t
(the output norm and gate live in the layer). In a chunk of l positions with b_t = g_0 + ... + g_t
(cumulated from the chunk's start):
    o_t = scale q_t exp(b_t) S_in + scale sum_{s<=t} [sum_k q_t[k] k_s[k] exp(b_t[k] - b_s[k])] v_s
The pair weights exp(b_t - b_s) differ per key channel, so the (l x l) scores are not one matmul of
q exp(b) and k exp(-b) (that overflows once a chunk decays by more than e^-88). As in the GLA paper's
secondary chunking, the chunk is cut into sub-chunks of SUB positions: a query sub-chunk meets all
earlier keys of its chunk in one matmul, both sides rescaled to the sub-chunk's first position
(every factor <= 1); the (SUB x SUB) blocks on the diagonal are summed directly over key channels,
under activation checkpointing so that their (SUB x SUB x Dk) weights are never stored.

Legend: B batch, L length, H heads, K head key dim, V head value dim, c chunks, l chunk positions,
n sub-chunks per chunk, s sub-chunk positions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from recurlen.models.layers import up
from recurlen.models.resets import chunk_counts, same_document

SUB = 16


def _diagonal_scores(q_nsK: torch.Tensor, k_nsK: torch.Tensor, b_nsK: torch.Tensor) -> torch.Tensor:
    """sum_k q_t k_s exp(b_t - b_s) for s <= t inside each sub-chunk: (..., s, s)."""
    s = q_nsK.shape[-2]
    causal_ts = torch.ones(s, s, dtype=q_nsK.dtype, device=q_nsK.device).tril()
    # Above the diagonal b_t - b_s > 0 and may overflow: clamp, then the mask zeroes those pairs.
    decay_tsK = torch.exp((b_nsK.unsqueeze(-2) - b_nsK.unsqueeze(-3)).clamp(max=0.0))
    scores = (q_nsK.unsqueeze(-2) * k_nsK.unsqueeze(-3) * decay_tsK).sum(-1)
    return scores * causal_ts


def gla_chunked(
    q_BLHK: torch.Tensor,
    k_BLHK: torch.Tensor,
    v_BLHV: torch.Tensor,
    g_BLHK: torch.Tensor,
    *,
    scale: float,
    chunk_size: int,
    initial_state_BHKV: torch.Tensor | None = None,
    resets_BL: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked GLA; g are log forget gates (<= 0). Returns o (B, L, H, V) and the final state (B, H, K, V).
    With `resets_BL` (True where a document starts) S is zero before each flagged position: a query meets only the
    keys of its own document, and a chunk passes on only what its last document wrote (recurlen.models.resets)."""
    batch, length, nheads, dk = q_BLHK.shape
    dv = v_BLHV.shape[-1]
    # float32 inside (float64 stays float64): the decays are products of many numbers in (0, 1].
    q, k, v, g = (up(t).transpose(1, 2) for t in (q_BLHK, k_BLHK, v_BLHV, g_BLHK))
    q = q * scale

    # Chunk length: a multiple of SUB (or the whole input when it is shorter than one sub-chunk).
    l = max(1, min(chunk_size, length))
    sub = min(SUB, l)
    l = -(-l // sub) * sub
    # Pad the end: padded steps have g = 0 (decay 1) and k = v = 0, so they leave the final state alone.
    pad = (-length) % l
    if pad:
        q, k, v, g = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v, g))
    c, n = (length + pad) // l, l // sub

    q, k, v, g = (t.reshape(batch, nheads, c, l, t.shape[-1]) for t in (q, k, v, g))
    b = g.cumsum(dim=-2)  # (B, H, c, l, K), log decay from the chunk's start through t
    # Flags so far in each chunk (B, 1, c, l): a pair of positions interacts only where the counts agree.
    counts = None if resets_BL is None else chunk_counts(resets_BL, pad, l).unsqueeze(1)

    # 1. Within chunks, earlier sub-chunks: rescale both sides to the query sub-chunk's first position.
    b_ns = b.view(batch, nheads, c, n, sub, dk)
    ref_n1K = b_ns[..., :1, :]
    q_ref = q.view(b_ns.shape) * torch.exp(b_ns - ref_n1K)
    # Keys at or after the reference position are masked below; clamp so that they cannot overflow.
    k_ref = k.unsqueeze(3) * torch.exp((ref_n1K - b.unsqueeze(3)).clamp(max=0.0))  # (B, H, c, n, l, K)
    earlier_ns = (torch.arange(l, device=q.device).view(1, l) < torch.arange(n, device=q.device).view(n, 1) * sub)
    scores_off = (q_ref @ k_ref.transpose(-1, -2)) * earlier_ns.to(q.dtype).unsqueeze(-2)  # (B, H, c, n, s, l)
    if counts is not None:
        scores_off = scores_off * same_document(counts, q.dtype).view(batch, 1, c, n, sub, l)
    o_intra = (scores_off.flatten(3, 4) @ v).view(batch, nheads, c, n, sub, dv)

    # 2. Diagonal sub-blocks, summed over key channels (recomputed in the backward, never stored).
    k_ns, v_ns = k.view(b_ns.shape), v.view(batch, nheads, c, n, sub, dv)
    q_ns = q.view(b_ns.shape)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q_ns, k_ns, b_ns)):
        scores_diag = checkpoint(_diagonal_scores, q_ns, k_ns, b_ns, use_reentrant=False)
    else:
        scores_diag = _diagonal_scores(q_ns, k_ns, b_ns)
    if counts is not None:
        scores_diag = scores_diag * same_document(counts.view(batch, 1, c, n, sub), q.dtype)
    o_intra = (o_intra + scores_diag @ v_ns).view(batch, nheads, c, l, dv)

    # 3. Each chunk's own contribution to the state at its end, then pass states across chunks.
    b_last = b[..., -1:, :]  # (B, H, c, 1, K)
    to_end = torch.exp(b_last - b)
    decay_chunk = torch.exp(b_last.squeeze(-2)).unsqueeze(-1)  # (B, H, c, K, 1)
    q_in = q * torch.exp(b)  # queries reading the state that entered the chunk
    if counts is not None:  # only the chunk's last document reaches its end; a flag ends the entering state
        to_end = to_end * (counts == counts[..., -1:]).to(q.dtype).unsqueeze(-1)
        decay_chunk = decay_chunk * (counts[..., -1:] == 0).to(q.dtype).unsqueeze(-1)
        q_in = q_in * (counts == 0).to(q.dtype).unsqueeze(-1)
    chunk_kv = (k * to_end).transpose(-1, -2) @ v  # (B, H, c, K, V)
    if initial_state_BHKV is None:
        state = q.new_zeros(batch, nheads, dk, dv)
    else:
        state = initial_state_BHKV.to(q.dtype)
    states_in = []
    for decay_BHK1, kv_BHKV in zip(decay_chunk.unbind(2), chunk_kv.unbind(2)):
        states_in.append(state)
        state = decay_BHK1 * state + kv_BHKV
    states_in_BHcKV = torch.stack(states_in, dim=2)

    # 4. The state entering each chunk, read by every query of the chunk.
    o_inter = q_in @ states_in_BHcKV
    o = (o_inter + o_intra).reshape(batch, nheads, c * l, dv)[:, :, :length]
    return o.transpose(1, 2), state


def gla_step(q_BHK: torch.Tensor, k_BHK: torch.Tensor, v_BHV: torch.Tensor, g_BHK: torch.Tensor, *, scale: float,
             state_BHKV: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of the recurrence (generation)."""
    dtype = state_BHKV.dtype
    q, k, v, g = (t.to(dtype) for t in (q_BHK, k_BHK, v_BHV, g_BHK))
    state = torch.exp(g).unsqueeze(-1) * state_BHKV + k.unsqueeze(-1) * v.unsqueeze(-2)
    return ((q * scale).unsqueeze(-2) @ state).squeeze(-2), state


__all__ = ["SUB", "gla_chunked", "gla_step"]
