"""The SSD scan of Mamba-2 in pure PyTorch: chunked (the CPU path and the oracle) and per token.

Recurrence per head, for t = 0..L-1 (h_{-1} = initial state):
    h_t = exp(dt_t * A) * h_t-1 + dt_t * x_t B_t^T        h: (P, N)
    y_t = h_t C_t
(the D skip and the gate live in the mixer). The chunked form splits L into chunks of length
l: inside a chunk it is a masked (l x l) "attention" with decays exp(segsum); across chunks a
state is passed sequentially, so the cost is linear in the number of chunks.

Legend: B batch, L length, H heads, P headdim, N d_state, G groups, c chunks, l/s chunk positions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def segsum(a: torch.Tensor) -> torch.Tensor:
    """out[..., i, j] = a[..., j+1] + ... + a[..., i] for i >= j, -inf above the diagonal.

    Computed as a masked cumulative sum rather than cumsum[i] - cumsum[j]: the difference of two
    large cumulative sums loses precision in float32, the masked sum never forms them.
    """
    T = a.shape[-1]
    a_TT = a.unsqueeze(-1).expand(*a.shape, T)  # [..., i, j] = a[..., i]
    strictly_lower = torch.tril(torch.ones(T, T, dtype=torch.bool, device=a.device), diagonal=-1)
    seg = a_TT.masked_fill(~strictly_lower, 0.0).cumsum(dim=-2)
    lower = torch.tril(torch.ones(T, T, dtype=torch.bool, device=a.device), diagonal=0)
    return seg.masked_fill(~lower, float("-inf"))


def up(t: torch.Tensor) -> torch.Tensor:
    """At least float32 (float64 stays float64, so the oracle can run in double precision)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _heads_from_groups(t_BLGN: torch.Tensor, nheads: int) -> torch.Tensor:
    ngroups = t_BLGN.shape[2]
    return t_BLGN if ngroups == nheads else t_BLGN.repeat_interleave(nheads // ngroups, dim=2)


def ssd_chunked(
    x_BLHP: torch.Tensor,
    dt_BLH: torch.Tensor,
    A_H: torch.Tensor,
    B_BLGN: torch.Tensor,
    C_BLGN: torch.Tensor,
    *,
    chunk_size: int,
    initial_state_BHPN: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked SSD. dt is already positive (after softplus). Returns y and the final state in float32."""
    batch, length, nheads, headdim = x_BLHP.shape
    d_state = B_BLGN.shape[-1]
    # float32 inside: the decays are products of up to L numbers in (0, 1].
    x, dt, A = up(x_BLHP), up(dt_BLH), up(A_H)
    B = _heads_from_groups(up(B_BLGN), nheads)
    C = _heads_from_groups(up(C_BLGN), nheads)

    # A chunk longer than the input only adds padded work; the result does not depend on the chunk size.
    chunk_size = max(1, min(chunk_size, length))
    # Pad the end only: padded steps have dt = 0, i.e. decay 1 and no input, so they leave the
    # final state untouched and their outputs are cut off below.
    pad = (-length) % chunk_size
    if pad:
        x, B, C = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (x, B, C))
        dt = F.pad(dt, (0, 0, 0, pad))
    n_chunks = (length + pad) // chunk_size
    l = chunk_size

    X_BclHP = (x * dt.unsqueeze(-1)).view(batch, n_chunks, l, nheads, headdim)
    B_BclHN = B.view(batch, n_chunks, l, nheads, d_state)
    C_BclHN = C.view(batch, n_chunks, l, nheads, d_state)
    Adt_BHcl = (dt * A).view(batch, n_chunks, l, nheads).permute(0, 3, 1, 2)
    Acum_BHcl = Adt_BHcl.cumsum(dim=-1)

    # 1. Within chunks: y_l = sum_{s<=l} (C_l . B_s) exp(sum_{s<k<=l} A dt_k) dt_s x_s.
    decay_BHcls = torch.exp(segsum(Adt_BHcl))
    scores_BHcls = torch.einsum("bclhn,bcshn->bhcls", C_BclHN, B_BclHN) * decay_BHcls
    y_diag_BclHP = torch.einsum("bhcls,bcshp->bclhp", scores_BHcls, X_BclHP)

    # 2. State contributed by each chunk alone, decayed to the chunk's end.
    decay_to_end_BclH = torch.exp(Acum_BHcl[..., -1:] - Acum_BHcl).permute(0, 2, 3, 1)
    chunk_states_BcHPN = torch.einsum("bclhn,bclhp->bchpn", B_BclHN * decay_to_end_BclH.unsqueeze(-1), X_BclHP)

    # 3. Pass the state across chunks sequentially: linear in the number of chunks.
    chunk_decay_BHc = torch.exp(Acum_BHcl[..., -1])
    if initial_state_BHPN is None:
        state = torch.zeros(batch, nheads, headdim, d_state, device=x.device, dtype=x.dtype)
    else:
        state = initial_state_BHPN.to(x.dtype)
    states_in = []
    for c in range(n_chunks):
        states_in.append(state)
        state = chunk_decay_BHc[:, :, c, None, None] * state + chunk_states_BcHPN[:, c]
    states_in_BcHPN = torch.stack(states_in, dim=1)

    # 4. Contribution of the state entering each chunk to the chunk's outputs.
    decay_from_start_BclH = torch.exp(Acum_BHcl).permute(0, 2, 3, 1)
    y_off_BclHP = torch.einsum("bclhn,bchpn->bclhp", C_BclHN, states_in_BcHPN) * decay_from_start_BclH.unsqueeze(-1)

    y_BLHP = (y_diag_BclHP + y_off_BclHP).reshape(batch, n_chunks * l, nheads, headdim)[:, :length]
    return y_BLHP, state


def ssd_step(
    x_BHP: torch.Tensor,
    dt_BH: torch.Tensor,
    A_H: torch.Tensor,
    B_BGN: torch.Tensor,
    C_BGN: torch.Tensor,
    state_BHPN: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of the recurrence (generation, and the naive reference)."""
    nheads = x_BHP.shape[1]
    dtype = state_BHPN.dtype
    x, dt, A = x_BHP.to(dtype), dt_BH.to(dtype), A_H.to(dtype)
    B = _heads_from_groups(B_BGN.unsqueeze(1), nheads).squeeze(1).to(dtype)
    C = _heads_from_groups(C_BGN.unsqueeze(1), nheads).squeeze(1).to(dtype)
    decay_BH = torch.exp(dt * A)
    state = decay_BH[..., None, None] * state_BHPN + (dt[..., None] * x)[..., None] * B[:, :, None, :]
    y_BHP = torch.einsum("bhpn,bhn->bhp", state, C)
    return y_BHP, state


def ssd_naive(
    x_BLHP: torch.Tensor,
    dt_BLH: torch.Tensor,
    A_H: torch.Tensor,
    B_BLGN: torch.Tensor,
    C_BLGN: torch.Tensor,
    *,
    initial_state_BHPN: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-by-token recurrence in the dtype of the inputs: the reference for tests."""
    batch, length, nheads, headdim = x_BLHP.shape
    state = initial_state_BHPN
    if state is None:
        state = x_BLHP.new_zeros(batch, nheads, headdim, B_BLGN.shape[-1])
    ys = []
    for t in range(length):
        y, state = ssd_step(x_BLHP[:, t], dt_BLH[:, t], A_H, B_BLGN[:, t], C_BLGN[:, t], state)
        ys.append(y)
    return torch.stack(ys, dim=1), state
