"""RWKV-6's WKV recurrence in pure PyTorch: chunked (the CPU path and the oracle) and per token.

Per head, for t = 0..L-1 (S_{-1} = initial state), w_t = exp(g_t) in (0, 1) per key channel:
    o_t = r_t (S_t-1 + diag(u) k_t^T v_t)          the bonus u weighs the current token
    S_t = diag(w_t) S_t-1 + k_t^T v_t              S: (Dk, Dv)
Unlike GLA the output reads the state *before* the current token's update. In a chunk with b_t = g_0 + ... + g_t
(inclusive) and e_t = b_t - g_t (exclusive), both cumulated from the chunk's start:
    o_t = r_t exp(e_t) S_in + sum_{s<t} [sum_k r_t[k] k_s[k] exp(e_t[k] - b_s[k])] v_s + (sum_k r_t[k] u[k] k_t[k]) v_t
The pair weights differ per key channel, so, as for GLA, the chunk is cut into sub-chunks of SUB positions: a query
sub-chunk meets the keys of earlier sub-chunks in one matmul with both sides rescaled to its first position's
exclusive decay (every factor <= 1, nothing overflows however strong the decay); inside a sub-chunk only its
SUB (SUB - 1) / 2 strictly lower pairs are formed and summed over key channels, recomputed in the backward instead
of stored. SUB = 8: the diagonal sums cost l x (SUB - 1) / 2 x K elementwise products per chunk (RWKV-6 heads are
64 wide), the matmuls barely more; with 4 or 16 the WKV scan's forward and backward took 1.0-1.7x as long on a CPU
(batch 64 x 32 and 4 x 512 tokens). Forming every (SUB x SUB) pair and masking the upper half made a tiny model's
training step 1.3x slower.

Legend: B batch, L length, H heads, K head key dim, V head value dim, c chunks, l chunk positions,
n sub-chunks per chunk, s sub-chunk positions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from recurlen.models.layers import up
from recurlen.models.resets import chunk_counts, same_document

SUB = 8


def _diagonal_scores(r_nsK: torch.Tensor, k_nsK: torch.Tensor, e_nsK: torch.Tensor,
                     b_nsK: torch.Tensor) -> torch.Tensor:
    """sum_k r_t k_s exp(e_t - b_s) for s < t inside each sub-chunk: (..., s, s), zero on and above the diagonal.

    Only the s (s - 1) / 2 strictly lower pairs are formed (gathered along the positions), then placed into the
    (s x s) block by a 0/1 matrix (exact: one term per entry). For s < t, e_t - b_s = g_s+1 + ... + g_t-1 <= 0:
    no factor exceeds 1 (up to rounding), so nothing needs clamping."""
    s = r_nsK.shape[-2]
    t_idx, s_idx = torch.tril_indices(s, s, -1, device=r_nsK.device)
    decay_PK = torch.exp(e_nsK.index_select(-2, t_idx) - b_nsK.index_select(-2, s_idx))
    pairs_P = (r_nsK.index_select(-2, t_idx) * k_nsK.index_select(-2, s_idx) * decay_PK).sum(-1)
    place_Pss = F.one_hot(t_idx * s + s_idx, s * s).to(pairs_P.dtype)
    return (pairs_P @ place_Pss).unflatten(-1, (s, s))


def wkv6_chunked(
    r_BLHK: torch.Tensor,
    k_BLHK: torch.Tensor,
    v_BLHV: torch.Tensor,
    g_BLHK: torch.Tensor,
    u_HK: torch.Tensor,
    *,
    chunk_size: int,
    initial_state_BHKV: torch.Tensor | None = None,
    resets_BL: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked WKV-6; g are log decays (<= 0). Returns o (B, L, H, V) and the final state (B, H, K, V).
    With `resets_BL` (True where a document starts) S is zero before each flagged position: a query meets only the
    earlier keys of its own document, and a chunk passes on only what its last document wrote
    (recurlen.models.resets); the bonus reads the current token alone, as before."""
    batch, length, nheads, dk = r_BLHK.shape
    dv = v_BLHV.shape[-1]
    # float32 inside (float64 stays float64): the decays are products of many numbers in (0, 1).
    r, k, v, g = (up(t).transpose(1, 2) for t in (r_BLHK, k_BLHK, v_BLHV, g_BLHK))
    u = up(u_HK).to(r.dtype)
    # The bonus term touches only the current token: no decay, no chunking.
    o_bonus = (r * u.unsqueeze(-2) * k).sum(-1, keepdim=True) * v  # (B, H, L, V)

    l = max(1, min(chunk_size, length))
    sub = min(SUB, l)
    l = -(-l // sub) * sub
    # Pad the end: padded steps have g = 0 (decay 1) and r = k = v = 0, so they leave the final state alone.
    pad = (-length) % l
    if pad:
        r, k, v, g = (F.pad(t, (0, 0, 0, pad)) for t in (r, k, v, g))
    c, n = (length + pad) // l, l // sub

    r, k, v, g = (t.reshape(batch, nheads, c, l, t.shape[-1]) for t in (r, k, v, g))
    b = g.cumsum(dim=-2)  # (B, H, c, l, K) inclusive log decay from the chunk's start
    e = b - g  # exclusive: what the state entering position t has decayed by
    # Flags so far in each chunk (B, 1, c, l): a pair of positions interacts only where the counts agree.
    counts = None if resets_BL is None else chunk_counts(resets_BL, pad, l).unsqueeze(1)

    # 1. Keys of earlier sub-chunks: both sides rescaled to the query sub-chunk's first exclusive decay.
    shape_ns = (batch, nheads, c, n, sub, dk)
    e_ns, b_ns = e.view(shape_ns), b.view(shape_ns)
    ref_n1K = e_ns[..., :1, :]
    r_ref = r.view(shape_ns) * torch.exp(e_ns - ref_n1K)
    # Keys at or after the reference position are masked below; clamp so that they cannot overflow.
    k_ref = k.unsqueeze(3) * torch.exp((ref_n1K - b.unsqueeze(3)).clamp(max=0.0))  # (B, H, c, n, l, K)
    earlier_ns = torch.arange(l, device=r.device).view(1, l) < torch.arange(n, device=r.device).view(n, 1) * sub
    scores_off = (r_ref @ k_ref.transpose(-1, -2)) * earlier_ns.to(r.dtype).unsqueeze(-2)  # (B, H, c, n, s, l)
    if counts is not None:
        scores_off = scores_off * same_document(counts, r.dtype).view(batch, 1, c, n, sub, l)
    o_intra = (scores_off.flatten(3, 4) @ v).view(batch, nheads, c, n, sub, dv)

    # 2. Earlier keys of the same sub-chunk, summed over key channels (recomputed in the backward, never stored).
    r_ns, k_ns, v_ns = r.view(shape_ns), k.view(shape_ns), v.view(batch, nheads, c, n, sub, dv)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (r_ns, k_ns, e_ns, b_ns)):
        scores_diag = checkpoint(_diagonal_scores, r_ns, k_ns, e_ns, b_ns, use_reentrant=False)
    else:
        scores_diag = _diagonal_scores(r_ns, k_ns, e_ns, b_ns)
    if counts is not None:
        scores_diag = scores_diag * same_document(counts.view(batch, 1, c, n, sub), r.dtype)
    o_intra = (o_intra + scores_diag @ v_ns).view(batch, nheads, c, l, dv)

    # 3. Each chunk's own contribution to the state at its end, then the states passed across chunks.
    b_last = b[..., -1:, :]  # (B, H, c, 1, K)
    to_end = torch.exp(b_last - b)
    decay_chunk = torch.exp(b_last.squeeze(-2)).unsqueeze(-1)  # (B, H, c, K, 1)
    r_in = r * torch.exp(e)  # queries reading the state that entered the chunk
    if counts is not None:  # only the chunk's last document reaches its end; a flag ends the entering state
        to_end = to_end * (counts == counts[..., -1:]).to(r.dtype).unsqueeze(-1)
        decay_chunk = decay_chunk * (counts[..., -1:] == 0).to(r.dtype).unsqueeze(-1)
        r_in = r_in * (counts == 0).to(r.dtype).unsqueeze(-1)
    chunk_kv = (k * to_end).transpose(-1, -2) @ v  # (B, H, c, K, V)
    state = r.new_zeros(batch, nheads, dk, dv) if initial_state_BHKV is None else initial_state_BHKV.to(r.dtype)
    states_in = []
    for decay_BHK1, kv_BHKV in zip(decay_chunk.unbind(2), chunk_kv.unbind(2)):
        states_in.append(state)
        state = decay_BHK1 * state + kv_BHKV
    states_in_BHcKV = torch.stack(states_in, dim=2)

    # 4. The state entering each chunk, read by every query of the chunk through its exclusive decay.
    o_inter = r_in @ states_in_BHcKV
    o = (o_inter + o_intra).reshape(batch, nheads, c * l, dv)[:, :, :length] + o_bonus
    return o.transpose(1, 2), state


def wkv6_step(r_BHK: torch.Tensor, k_BHK: torch.Tensor, v_BHV: torch.Tensor, g_BHK: torch.Tensor, u_HK: torch.Tensor,
              *, state_BHKV: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of the recurrence (generation)."""
    dtype = state_BHKV.dtype
    r, k, v, g, u = (t.to(dtype) for t in (r_BHK, k_BHK, v_BHV, g_BHK, u_HK))
    kv_BHKV = k.unsqueeze(-1) * v.unsqueeze(-2)
    o = (r.unsqueeze(-2) @ (state_BHKV + u.unsqueeze(-1) * kv_BHKV)).squeeze(-2)
    return o, torch.exp(g).unsqueeze(-1) * state_BHKV + kv_BHKV


__all__ = ["SUB", "wkv6_chunked", "wkv6_step"]
