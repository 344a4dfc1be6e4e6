"""Mamba-3's recurrence (SISO) in pure PyTorch: chunked, with the state in and out, and one token at a time.

Per head, with q_t = rot(C_t + C_bias, theta_t) and k_t = rot(B_t + B_bias, theta_t) (B, C shared by a group),
v_t = x_t, decay alpha_t = exp(A_t dt_t) and the trapezoid's weight lambda_t = sigmoid(trap_t) (Lahoti et al.,
Mamba-3, eq. for the exponential-trapezoidal discretisation):

    theta_t = theta_t-1 + pi tanh(angle_t) dt_t                     (mod 2 pi; per rotated pair of entries)
    h_t     = alpha_t h_t-1 + beta_t v_t-1 k_t-1^T + gamma_t v_t k_t^T,   beta_t = alpha_t dt_t (1 - lambda_t),
                                                                          gamma_t = dt_t lambda_t
    y_t     = h_t q_t

rot(., theta) turns each pair of entries (2i, 2i+1), i < S, by theta_i; entries past 2S are not rotated. The
state is (theta, h, k_t-1, v_t-1): what the first token of the next call needs.

The chunked form: token s enters h at step s with weight gamma_s and at step s+1 with beta_s+1 = alpha_s+1 x
dt_s+1 (1 - lambda_s+1); decayed to any t > s both are exp(A-sum over (s, t]) times
scale_s = gamma_s + dt_s+1 (1 - lambda_s+1). So h_t = sum_s<t exp(..) scale_s v_s k_s^T + gamma_t v_t k_t^T: SSD
with a weight per key and its own diagonal, and a carried state that enters as h_-1 + dt_0 (1 - lambda_0) v_-1 k_-1^T.

Legend: B batch, L length, H heads, P headdim, N d_state, G groups, S angles per head, c chunks, l / s chunk
positions.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from recurlen.models.layers import up
from recurlen.models.resets import chunk_counts, same_document

TWO_PI = 2 * math.pi

Mamba3Parts = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
"""One layer's state in the state type's field order: ssm (B, H, P, N), angle (B, H, S), k (B, H, N), v (B, H, P)."""


def rotate(t_xN: torch.Tensor, theta_xS: torch.Tensor) -> torch.Tensor:
    """Turn the pairs (2i, 2i+1), i < S, of the last dim by theta_i (mamba-ssm's SISO pairing); the rest stays."""
    n_rot = 2 * theta_xS.shape[-1]
    pairs = t_xN[..., :n_rot].unflatten(-1, (-1, 2))
    t0, t1 = pairs[..., 0], pairs[..., 1]
    cos, sin = torch.cos(theta_xS), torch.sin(theta_xS)
    turned = torch.stack((t0 * cos - t1 * sin, t0 * sin + t1 * cos), dim=-1).flatten(-2)
    return torch.cat((turned, t_xN[..., n_rot:]), dim=-1)


def angle_rate(angles_xS: torch.Tensor, dt_x: torch.Tensor) -> torch.Tensor:
    """The angle's increment per token: pi tanh(angle) dt (a turn of at most pi dt per token)."""
    return torch.tanh(angles_xS) * math.pi * dt_x.unsqueeze(-1)


def _heads(t_BLGN: torch.Tensor, nheads: int) -> torch.Tensor:
    groups = t_BLGN.shape[-2]
    return t_BLGN if groups == nheads else t_BLGN.repeat_interleave(nheads // groups, dim=-2)


def mamba3_chunked(
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
    chunk_size: int,
    initial: Mamba3Parts | None = None,
    resets_BL: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Mamba3Parts]:
    """y (without the D skip and the gate) and the final state (ssm, angle, k, v), float32 or wider.

    trap and angles are raw (sigmoid and pi tanh happen here), as mamba-ssm's kernel takes them; adt = A dt <= 0.
    With `resets_BL` (True where a document starts) the whole state (h, the angle, the previous k and v) is zero
    before each flagged position: the angle restarts its sum there, and every decay across a flag is cut
    (recurlen.models.resets).
    """
    batch, length, nheads, headdim = v_BLHP.shape
    d_state = q_BLGN.shape[-1]
    q, k, v, adt, dt, trap, ang = (up(t) for t in (q_BLGN, k_BLGN, v_BLHP, adt_BLH, dt_BLH, trap_BLH, angles_BLHS))
    dtype = v.dtype
    if initial is None:
        h0 = v.new_zeros(batch, nheads, headdim, d_state)
        theta0 = v.new_zeros(batch, nheads, ang.shape[-1])
        k_prev, v_prev = v.new_zeros(batch, nheads, d_state), v.new_zeros(batch, nheads, headdim)
    else:
        h0, theta0, k_prev, v_prev = (up(t) for t in initial)

    # The cumulative angle: summed in float64 (it grows without bound before the mod), kept mod 2 pi.
    rate = angle_rate(ang, dt).double()
    theta = theta0.unsqueeze(1).double() + rate.cumsum(dim=1)
    if resets_BL is not None:
        # Each document's angle sums its own rates: less the sum up to its start (theta0 included).
        pos = torch.arange(length, device=v.device).expand(batch, length)
        start_BL = torch.where(resets_BL, pos, torch.full_like(pos, -1)).cummax(dim=1).values
        before = (theta - rate).gather(1, start_BL.clamp(min=0)[:, :, None, None].expand_as(theta))
        theta = theta - torch.where((start_BL >= 0)[:, :, None, None], before, torch.zeros_like(before))
    theta = torch.remainder(theta, TWO_PI)
    theta = theta.to(dtype)
    q = rotate(_heads(q, nheads) + up(q_bias_HN), theta)
    k = rotate(_heads(k, nheads) + up(k_bias_HN), theta)

    lam = torch.sigmoid(trap)
    gamma = dt * lam
    # scale_s = gamma_s + dt_s+1 (1 - lambda_s+1); the last token's second term belongs to the next call.
    scale = gamma + F.pad((dt * (1 - lam))[:, 1:], (0, 0, 0, 1))
    # The previous call's last token enters with the first token's beta (its decay alpha_0 is applied below).
    h0 = h0 + (dt[:, 0] * (1 - lam[:, 0]))[..., None, None] * v_prev.unsqueeze(-1) * k_prev.unsqueeze(-2)

    chunk_size = max(1, min(chunk_size, length))
    pad = (-length) % chunk_size
    # Padded steps have adt = 0 (decay 1) and weight 0: they leave the state alone and their outputs are cut off.
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (q, k, v))
        adt, gamma, scale = (F.pad(t, (0, 0, 0, pad)) for t in (adt, gamma, scale))
    c, l = (length + pad) // chunk_size, chunk_size
    q, k, v = (t.unflatten(1, (c, l)) for t in (q, k, v))
    adt, gamma, scale = (t.unflatten(1, (c, l)) for t in (adt, gamma, scale))

    # Decay from s to l within a chunk: differences of float64 cumulative sums, so float32 never cancels.
    acum = adt.double().cumsum(dim=2)  # (B, c, l, H)
    seg_BclsH = acum[:, :, :, None] - acum[:, :, None, :]
    strict = torch.ones(l, l, dtype=torch.bool, device=v.device).tril(-1)[None, None, :, :, None]
    decay_BclsH = torch.exp(seg_BclsH.masked_fill(~strict, -math.inf)).to(dtype)
    counts_Bcl = None if resets_BL is None else chunk_counts(resets_BL, pad, l)
    if counts_Bcl is not None:  # pairs of one document only (a flag cuts the decay and the previous k / v)
        decay_BclsH = decay_BclsH * same_document(counts_Bcl, dtype).unsqueeze(-1)
    weight_BclsH = decay_BclsH * scale[:, :, None]  # strictly below the diagonal: exp(..) scale_s
    weight_BclsH = weight_BclsH + torch.diag_embed(gamma.transpose(2, 3), dim1=2, dim2=3)  # the diagonal: gamma_l

    # 1. Within chunks.
    scores_BclsH = torch.einsum("bclhn,bcshn->bclsh", q, k) * weight_BclsH
    y_BclHP = torch.einsum("bclsh,bcshp->bclhp", scores_BclsH, v)

    # 2. What each chunk adds to the state, decayed to the chunk's end.
    to_end_BclH = (torch.exp(acum[:, :, -1:] - acum) * scale).to(dtype)
    if counts_Bcl is not None:  # only the chunk's last document reaches its end
        to_end_BclH = to_end_BclH * (counts_Bcl == counts_Bcl[..., -1:]).to(dtype).unsqueeze(-1)
    chunk_states_BcHPN = torch.einsum("bclh,bclhp,bclhn->bchpn", to_end_BclH, v, k)

    # 3. The state entering each chunk, passed sequentially (linear in the number of chunks).
    chunk_decay_BcH = torch.exp(acum[:, :, -1]).to(dtype)
    decay_in_BclH = torch.exp(acum).to(dtype)
    if counts_Bcl is not None:  # a flag ends the state that entered the chunk
        chunk_decay_BcH = chunk_decay_BcH * (counts_Bcl[..., -1:] == 0).to(dtype)
        decay_in_BclH = decay_in_BclH * (counts_Bcl == 0).to(dtype).unsqueeze(-1)
    h, states_in = h0, []
    for i in range(c):
        states_in.append(h)
        h = chunk_decay_BcH[:, i, :, None, None] * h + chunk_states_BcHPN[:, i]
    states_in_BcHPN = torch.stack(states_in, dim=1)

    # 4. The entering state's contribution, decayed to each position.
    y_off_BclHP = torch.einsum("bclhn,bchpn->bclhp", q, states_in_BcHPN) * decay_in_BclH.unsqueeze(-1)
    y_BLHP = (y_BclHP + y_off_BclHP).flatten(1, 2)[:, :length]
    last = (length - 1) // l, (length - 1) % l
    return y_BLHP, (h, theta[:, -1], k[:, last[0], last[1]], v[:, last[0], last[1]])


def mamba3_step(
    q_BGN: torch.Tensor,
    k_BGN: torch.Tensor,
    v_BHP: torch.Tensor,
    adt_BH: torch.Tensor,
    dt_BH: torch.Tensor,
    trap_BH: torch.Tensor,
    angles_BHS: torch.Tensor,
    q_bias_HN: torch.Tensor,
    k_bias_HN: torch.Tensor,
    state: Mamba3Parts,
) -> tuple[torch.Tensor, Mamba3Parts]:
    """One token of the recurrence, as written in the module docstring (generation)."""
    h, theta, k_prev, v_prev = (up(t) for t in state)
    nheads = v_BHP.shape[1]
    v, adt, dt, lam = up(v_BHP), up(adt_BH), up(dt_BH), torch.sigmoid(up(trap_BH))
    theta = torch.remainder(theta + angle_rate(up(angles_BHS), dt), TWO_PI)
    q = rotate(_heads(up(q_BGN), nheads) + up(q_bias_HN), theta)
    k = rotate(_heads(up(k_BGN), nheads) + up(k_bias_HN), theta)
    alpha = torch.exp(adt)
    beta, gamma = alpha * dt * (1 - lam), dt * lam
    h = (alpha[..., None, None] * h + beta[..., None, None] * v_prev.unsqueeze(-1) * k_prev.unsqueeze(-2)
         + gamma[..., None, None] * v.unsqueeze(-1) * k.unsqueeze(-2))
    y = torch.einsum("bhpn,bhn->bhp", h, q)
    return y, (h, theta, k, v)


__all__ = ["Mamba3Parts", "angle_rate", "mamba3_chunked", "mamba3_step", "rotate"]
