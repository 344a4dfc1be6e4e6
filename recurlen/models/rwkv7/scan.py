"""RWKV-7's WKV recurrence (the generalised delta rule with vector decay) in pure PyTorch: chunked (the CPU path and
the oracle) and per token.

Per head, for t = 0..L-1 (S_-1 = initial state, S: (K, V) key-major), with a per-key-channel decay
w_t = exp(g_t) in (0, 1) and two key-sized vectors a_t, b_t:
    S_t = (diag(w_t) + b_t a_t^T) S_t-1 + k_t v_t^T          the transition matrix is diagonal plus rank one
    o_t = S_t^T r_t                                           the output reads the state *after* the update
RWKV-7 sets a = -kappa, b = kappa * alpha (kappa the L2-normalised removal key, alpha the in-context learning rate
in (0, 1)): the value the state holds at kappa is partly removed before k_t v_t^T is written (the paper's
wkv_t = wkv_t-1 (diag(w_t) - kappa^T (alpha * kappa)) + v^T k, transposed). fla's chunk_rwkv7 takes the same a, b.

In a chunk entering with S_0, with c_t = g_0 + ... + g_t (inclusive, from the chunk's start), e_t = c_t - g_t
(exclusive) and u_t = S_t-1^T a_t (what the rank-one part reads), unrolling gives
    S_t = exp(c_t) S_0 + sum_{s<=t} exp(c_t - c_s) (k_s v_s^T + b_s u_s^T)                  (exp(.) per key channel)
    u_t = (a_t exp(e_t))^T S_0 + sum_{s<t} [a_t exp(e_t - c_s) . k_s] v_s + [a_t exp(e_t - c_s) . b_s] u_s
    o_t = (r_t exp(c_t))^T S_0 + sum_{s<=t} [r_t exp(c_t - c_s) . k_s] v_s + [r_t exp(c_t - c_s) . b_s] u_s
so (I - P_ab) u = P_ak v + (a exp(e)) S_0 with P strictly lower triangular: one unit-triangular solve per chunk
gives u = U + W S_0 (the WY form, as for Gated DeltaNet, with key vectors a, b where the delta rule has k);
only W S_0 crosses chunks.

Why the pair weights are safe as matmuls: a pair's factor exp(x_t - c_s) differs per key channel, so it cannot be
pulled out of the dot product whole; it is split as exp(x_t - m) exp(m - c_s) around the chunk's midpoint m, each
side folded into its own vector. RWKV-7's decay is bounded, g = -exp(-1/2) sigmoid(.) >= -0.607 per token, so in a
chunk of l positions every exponent lies within +-0.607 (l/2 + 1): at most e^+-20.1 for l = 64, far inside
float32's range (e^+-88), and each factor keeps its relative precision, so the products are as exact as the
per-pair exponentials (which would cost an (l x l x K) tensor per chunk; RWKV-6's decays are unbounded and need
them). The config caps chunk_size at 64 (recurlen.models.rwkv7.config.MAX_CHUNK). A fix that scales the decay by
s > 1 (recurlen.models.timescales) moves the floor to s x -exp(-1/2): `chunk_for` then shortens the chunk so that the
exponents keep that range. The terms that touch S_0 and the state carried to the next chunk use exp(c_t), exp(e_t),
exp(c_last - c_s) <= 1 directly.

Legend: B batch, L length, H heads, K head key dim, V head value dim, c chunks, l chunk positions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from recurlen.models.layers import up
from recurlen.models.resets import chunk_counts, same_document

LOG_DECAY_FLOOR = -0.6065306597126334
"""RWKV-7's smallest log decay per token, -exp(-1/2) (BlinkDL: w = exp(-0.606531 sigmoid(.)))."""
SCALED_LOG_DECAY_MIN = -60.0
"""Where a decay scaled by a fix stops (recurlen.models.timescales): a token then keeps e^-60 < 1e-26 of the state,
beneath even float64's resolution, so the stop changes nothing a float holds, and one position's factor e^60 stays
finite in float32 (e^88), however large the scale."""
PAIR_EXPONENT = -LOG_DECAY_FLOOR * (64 // 2 + 1)
"""The largest exponent of a pair factor at RWKV-7's own floor in chunks of 64 (20.0): what `chunk_for` keeps."""


def chunk_for(chunk_size: int, floor: float) -> int:
    """The longest chunk, at most chunk_size, whose pair factors stay within e^+-PAIR_EXPONENT for log decays >= floor
    (every exponent is at most |floor| (l // 2 + 1)); 1 where even one position's exceed it (a token's exponent is then
    |floor| itself, finite while |floor| < 88)."""
    half = int(PAIR_EXPONENT / -floor) - 1  # the largest l // 2 allowed
    return max(1, min(chunk_size, 2 * half + 1))


def wkv7_chunked(
    r_BLHK: torch.Tensor,
    g_BLHK: torch.Tensor,
    k_BLHK: torch.Tensor,
    v_BLHV: torch.Tensor,
    a_BLHK: torch.Tensor,
    b_BLHK: torch.Tensor,
    *,
    chunk_size: int,
    initial_state_BHKV: torch.Tensor | None = None,
    resets_BL: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked WKV-7; g are log decays in [LOG_DECAY_FLOOR, 0] (or in [floor, 0] with a chunk_size no longer than
    chunk_for(., floor)). Returns o (B, L, H, V) and the final state
    (B, H, K, V). With `resets_BL` (True where a document starts) S is zero before each flagged position: the reads
    u, the outputs and the state at a chunk's end meet only their own document's writes, and S_0 only up to the
    chunk's first flag (recurlen.models.resets)."""
    batch, length, nheads, dk = r_BLHK.shape
    dv = v_BLHV.shape[-1]
    # float32 inside (float64 stays float64): the decays are products of many numbers in (0, 1).
    r, g, k, v, a, b = (up(t).transpose(1, 2) for t in (r_BLHK, g_BLHK, k_BLHK, v_BLHV, a_BLHK, b_BLHK))
    l = max(1, min(chunk_size, length))
    # Pad the end: padded steps have g = 0 (decay 1) and r = k = v = a = b = 0, so they leave the state alone.
    pad = (-length) % l
    if pad:
        r, g, k, v, a, b = (F.pad(t, (0, 0, 0, pad)) for t in (r, g, k, v, a, b))
    c = (length + pad) // l
    r, g, k, v, a, b = (t.reshape(batch, nheads, c, l, t.shape[-1]) for t in (r, g, k, v, a, b))

    cum = g.cumsum(dim=-2)  # (B, H, c, l, K) inclusive log decay from the chunk's start
    exc = cum - g  # exclusive: what the state entering position t has decayed by
    mid = cum[..., l // 2:l // 2 + 1, :]  # the reference both sides of a pair are rescaled to
    # The four pair matrices in one product: [r; a] (rescaled to their reads) against [k; b] (to their writes).
    reads_mid = torch.cat([r * torch.exp(cum - mid), a * torch.exp(exc - mid)], dim=-2)  # (B, H, c, 2l, K)
    writes_mid = (torch.cat([k, b], dim=-2).unflatten(-2, (2, l)) * torch.exp(mid - cum).unsqueeze(-3)).flatten(-3, -2)
    pairs = reads_mid @ writes_mid.transpose(-1, -2)  # (B, H, c, 2l, 2l)
    upto = torch.ones(l, l, dtype=r.dtype, device=r.device).tril()  # s <= t
    before = upto.tril(-1)  # s < t
    # Flags so far in each chunk (B, 1, c, l): a pair interacts only where the counts agree; 0 where S_0 is read.
    counts = None if resets_BL is None else chunk_counts(resets_BL, pad, l).unsqueeze(1)
    if counts is not None:
        same = same_document(counts, r.dtype)
        upto, before = upto * same, before * same
    P_rk, P_rb = pairs[..., :l, :l] * upto, pairs[..., :l, l:] * upto  # (B, H, c, l, l)
    P_ak, P_ab = pairs[..., l:, :l] * before, pairs[..., l:, l:] * before

    # u = U + W S_0, from (I - P_ab) u = P_ak v + (a exp(e)) S_0.
    eye = torch.eye(l, dtype=r.dtype, device=r.device)
    reads_in, writes_out = torch.exp(exc), torch.exp(cum[..., -1:, :] - cum)
    r_in = r * torch.exp(cum)  # queries reading the state that entered the chunk
    decay_chunk = torch.exp(cum[..., -1:, :]).transpose(-1, -2)  # (B, H, c, K, 1)
    if counts is not None:  # S_0 is read up to the first flag; only the chunk's last document reaches its end
        entered = (counts == 0).to(r.dtype).unsqueeze(-1)
        reads_in, r_in = reads_in * entered, r_in * entered
        writes_out = writes_out * (counts == counts[..., -1:]).to(r.dtype).unsqueeze(-1)
        decay_chunk = decay_chunk * (counts[..., -1:] == 0).to(r.dtype).unsqueeze(-1)
    rhs = torch.cat([P_ak @ v, a * reads_in], dim=-1)
    uw = torch.linalg.solve_triangular(eye - P_ab, rhs, upper=False, unitriangular=True)
    U, W = uw.split([dv, dk], dim=-1)  # (B, H, c, l, V), (B, H, c, l, K)

    o_kv = P_rk @ v  # the chunk's own keys and values, read by its queries
    kv_out = (k * writes_out).transpose(-1, -2) @ v  # (B, H, c, K, V) the chunk's writes as they stand at its end
    b_out = b * writes_out
    state = r.new_zeros(batch, nheads, dk, dv) if initial_state_BHKV is None else initial_state_BHKV.to(r.dtype)
    outs = []
    for i in range(c):
        u = U[:, :, i] + W[:, :, i] @ state
        outs.append(r_in[:, :, i] @ state + o_kv[:, :, i] + P_rb[:, :, i] @ u)
        state = decay_chunk[:, :, i] * state + kv_out[:, :, i] + b_out[:, :, i].transpose(-1, -2) @ u
    o = torch.stack(outs, dim=2).reshape(batch, nheads, c * l, dv)[:, :, :length]
    return o.transpose(1, 2), state


def wkv7_step(r_BHK: torch.Tensor, g_BHK: torch.Tensor, k_BHK: torch.Tensor, v_BHV: torch.Tensor,
              a_BHK: torch.Tensor, b_BHK: torch.Tensor, *,
              state_BHKV: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of the recurrence (generation)."""
    dtype = state_BHKV.dtype
    r, g, k, v, a, b = (t.to(dtype) for t in (r_BHK, g_BHK, k_BHK, v_BHV, a_BHK, b_BHK))
    read_BH1V = a.unsqueeze(-2) @ state_BHKV
    state = torch.exp(g).unsqueeze(-1) * state_BHKV + b.unsqueeze(-1) * read_BH1V + k.unsqueeze(-1) * v.unsqueeze(-2)
    return (r.unsqueeze(-2) @ state).squeeze(-2), state


__all__ = ["LOG_DECAY_FLOOR", "PAIR_EXPONENT", "SCALED_LOG_DECAY_MIN", "chunk_for", "wkv7_chunked", "wkv7_step"]
