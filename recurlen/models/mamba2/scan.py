"""The SSD scan of Mamba-2 in pure PyTorch: chunked (the CPU path and the oracle) and per token.

Recurrence per head, for t = 0..L-1 (h_{-1} = initial state):
    h_t = exp(dt_t * A) * h_t-1 + dt_t * x_t B_t^T        h: (P, N)
    y_t = h_t C_t
(the D skip and the gate live in the mixer). The chunked form splits L into chunks of length
l: inside a chunk it is a masked (l x l) "attention" with decays exp(segsum); across chunks a
state is passed sequentially, so the cost is linear in the number of chunks.

Two training-free changes (Stuffed Mamba's, recurlen.evaluation.fixes.stuffed_mamba) live here: a shift of the log
decay, dt_t * A + shift (each token's decay multiplied by exp(shift)), which both forms take; and a cap on each
head's state norm after every token, h_t <- h_t min(1, cap / ||h_t||), which is not linear in h, so it has no
chunked form: `ssd_capped` runs it token by token.

Legend: B batch, L length, H heads, P headdim, N d_state, G groups (r = H/G heads each, R = r*P rows),
c chunks, l/s chunk positions.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from recurlen.models.layers import up
from recurlen.models.resets import chunk_counts, same_document


def _heads_from_groups(t_BLGN: torch.Tensor, nheads: int) -> torch.Tensor:
    ngroups = t_BLGN.shape[2]
    return t_BLGN if ngroups == nheads else t_BLGN.repeat_interleave(nheads // ngroups, dim=2)


class _ChunkDecay(torch.autograd.Function):
    """exp(segsum(a)) over the last dim: (..., l) -> (..., l, l), zero above the diagonal.

    segsum[l, s] = a[s+1] + ... + a[l] is the difference of float64 cumulative sums, exact enough
    that float32 never cancels. The backward is written out: autograd through a masked (l x l)
    cumsum costs more than the rest of the scan on CPU.
    """

    @staticmethod
    def forward(ctx, a_l: torch.Tensor) -> torch.Tensor:
        l = a_l.shape[-1]
        cs = a_l.double().cumsum(dim=-1)
        # A 0/1 float mask: multiplying by it is ~3x faster on CPU than masked_fill_ with a bool one.
        causal_ls = torch.ones(l, l, dtype=a_l.dtype, device=a_l.device).tril()
        seg_ls = (cs.unsqueeze(-1) - cs.unsqueeze(-2)).to(a_l.dtype).mul_(causal_ls)
        # No -inf mask and a floor at log(smallest normal): CPU exp is 5-30x slower where its result
        # underflows (-inf included). The floor moves no decay by more than finfo.tiny.
        floor = math.log(torch.finfo(seg_ls.dtype).tiny)
        decay_ls = seg_ls.clamp_(min=floor).exp_().mul_(causal_ls)
        ctx.save_for_backward(decay_ls)
        return decay_ls

    @staticmethod
    def backward(ctx, grad_ls: torch.Tensor) -> torch.Tensor:
        (decay_ls,) = ctx.saved_tensors
        g_ls = grad_ls * decay_ls  # d/d segsum; zero above the diagonal, the diagonal cancels below
        g_cs = g_ls.sum(dim=-1) - g_ls.sum(dim=-2)  # segsum[l, s] = cs[l] - cs[s]
        return g_cs.flip(-1).cumsum(dim=-1).flip(-1)  # cs = cumsum(a)


class _StatePass(torch.autograd.Function):
    """The states entering each chunk, h_0 = initial and h_k+1 = decay_k * h_k + chunk_state_k, and the final one.

    The same arithmetic as the loop written with autograd, in a better layout: the entering states
    are kept d_state-major, (N, H*P) per chunk, which is the layout the scan reads them in (C @ h^T)
    and the layout their gradient comes back in. No stack in either direction, and the backward's
    products meet two tensors of one layout, so they run at full speed. Each product that a
    reduction follows keeps the layout autograd gave it, so the sums add in the same order.
    """

    @staticmethod
    def forward(ctx, decay_BcH: torch.Tensor, chunk_states_BcHPN: torch.Tensor,
                initial_BHPN: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        batch, c, nheads, headdim, d_state = chunk_states_BcHPN.shape
        # The states in the dtype the update decay * h + chunk_state promotes to: float32 under bf16 autocast
        # (decay is float32, the chunk states bf16), so the carried state never accumulates in bf16.
        dtype = torch.result_type(decay_BcH, chunk_states_BcHPN)
        states_BcHPN = _d_state_major(chunk_states_BcHPN, (batch, c, nheads, headdim, d_state), dtype)
        # The final state in the same layout, so that every update runs on operands of one layout (its
        # own tensor: a (c + 1)-th slot would leave the c entering states without one batch stride).
        final_BHPN = _d_state_major(chunk_states_BcHPN, (batch, 1, nheads, headdim, d_state), dtype)[:, 0]
        if initial_BHPN is None:
            states_BcHPN[:, 0].zero_()
        else:
            states_BcHPN[:, 0].copy_(initial_BHPN)
        for k in range(c):
            out = states_BcHPN[:, k + 1] if k + 1 < c else final_BHPN
            torch.mul(decay_BcH[:, k, :, None, None], states_BcHPN[:, k], out=out)
            out.add_(chunk_states_BcHPN[:, k])
        ctx.save_for_backward(decay_BcH, states_BcHPN)
        ctx.has_initial = initial_BHPN is not None
        # Gradients that nothing produces stay None, as autograd leaves them: no work on zeros.
        ctx.set_materialize_grads(False)
        if c == 1 and initial_BHPN is None:
            ctx.mark_non_differentiable(states_BcHPN)  # only the zero state enters
        return states_BcHPN, final_BHPN

    @staticmethod
    def backward(ctx, grad_states_BcHPN: torch.Tensor | None, grad_final_BHPN: torch.Tensor | None):
        decay_BcH, states_BcHPN = ctx.saved_tensors
        c = decay_BcH.shape[1]
        # The gradient of the state leaving chunk k is also chunk_state_k's: where it is a sum, the sum
        # is written straight into that slot (in grad_states' layout, the one autograd's sum takes).
        grad_chunk_states = _d_state_major(states_BcHPN, states_BcHPN.shape, states_BcHPN.dtype)
        grad_decay = [torch.zeros_like(decay_BcH[:, 0])] * c
        g = grad_final_BHPN  # None where nothing depends on the state
        if g is not None:
            grad_chunk_states[:, c - 1].copy_(g)
        for k in reversed(range(c)):
            if g is None:
                grad_chunk_states[:, k].zero_()
            else:
                grad_decay[k] = (g * states_BcHPN[:, k]).sum((2, 3))
            if k == 0 and not ctx.has_initial:
                break  # the zero state entering chunk 0 depends on nothing
            # the state entering chunk k: read by the scan (grad_states) and by chunk k's update
            g_in = None if grad_states_BcHPN is None else grad_states_BcHPN[:, k]
            slot = grad_chunk_states[:, k - 1] if k > 0 else None
            if g is not None:
                g_decayed = g * decay_BcH[:, k, :, None, None]
                if g_in is not None and slot is not None:
                    g_in = torch.add(g_in, g_decayed, out=slot)
                    slot = None
                else:
                    g_in = g_decayed if g_in is None else g_in + g_decayed
            if slot is not None and g_in is not None:
                slot.copy_(g_in)
            g = g_in
        return torch.stack(grad_decay, dim=1), grad_chunk_states, g if ctx.has_initial else None


def _d_state_major(like: torch.Tensor, shape_BcHPN, dtype: torch.dtype) -> torch.Tensor:
    """An empty (B, c, H, P, N) tensor laid out as (B, c, N, H, P): each chunk's state is a contiguous (N, H*P)."""
    batch, c, nheads, headdim, d_state = shape_BcHPN
    return like.new_empty(batch, c, d_state, nheads, headdim, dtype=dtype).permute(0, 1, 3, 4, 2)


def ssd_chunked(
    x_BLHP: torch.Tensor,
    dt_BLH: torch.Tensor,
    A_H: torch.Tensor,
    B_BLGN: torch.Tensor,
    C_BLGN: torch.Tensor,
    *,
    chunk_size: int,
    initial_state_BHPN: torch.Tensor | None = None,
    resets_BL: torch.Tensor | None = None,
    log_decay_shift: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked SSD. dt is already positive (after softplus). Returns y and the final state in float32.

    C.B^T is formed once per group and shared by the group's heads (one group in the official
    models: H times less work than per head, and no H-fold copies of B and C); only decays are per head.
    With `resets_BL` (True where a document starts) h is zero before each flagged position: every decay across a
    flag is cut, inside the chunks (pairs of one document only) and between them (recurlen.models.resets).
    `log_decay_shift` (a scalar or one per head) is added to every token's log decay dt A.
    """
    batch, length, nheads, headdim = x_BLHP.shape
    ngroups, d_state = B_BLGN.shape[-2:]
    r = nheads // ngroups
    # float32 inside: the decays are products of up to L numbers in (0, 1].
    x, dt, A, B, C = up(x_BLHP), up(dt_BLH), up(A_H), up(B_BLGN), up(C_BLGN)

    # A chunk longer than the input only adds padded work; the result does not depend on the chunk size.
    chunk_size = max(1, min(chunk_size, length))
    # Pad the end only: padded steps have dt = 0, i.e. decay 1 and no input, so they leave the
    # final state untouched and their outputs are cut off below.
    pad = (-length) % chunk_size
    if pad:
        x, B, C = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (x, B, C))
        dt = F.pad(dt, (0, 0, 0, pad))
    c, l = (length + pad) // chunk_size, chunk_size

    X_BclHP = (x * dt.unsqueeze(-1)).view(batch, c, l, nheads, headdim)
    B_BcGln = B.view(batch, c, l, ngroups, d_state).transpose(2, 3)
    C_BcGln = C.view(batch, c, l, ngroups, d_state).transpose(2, 3)
    Adt_BLH = dt * A
    if log_decay_shift is not None:  # real tokens only: a padded step keeps decay 1, or it would move the final state
        Adt_BLH = Adt_BLH + F.pad(up(log_decay_shift).expand(batch, length, nheads), (0, 0, 0, pad))
    Adt_BcHl = Adt_BLH.view(batch, c, l, nheads).transpose(2, 3)
    Acum_BcHl = Adt_BcHl.cumsum(dim=-1)

    # Flags so far in each chunk: pairs of one document agree; 0 where the entering state is still read.
    counts_Bcl = None if resets_BL is None else chunk_counts(resets_BL, pad, chunk_size)

    # 1. Within chunks: y_l = sum_{s<=l} (C_l . B_s) exp(sum_{s<k<=l} A dt_k) dt_s x_s.
    CB_BcGls = C_BcGln @ B_BcGln.transpose(-1, -2)
    if counts_Bcl is not None:
        CB_BcGls = CB_BcGls * same_document(counts_Bcl, CB_BcGls.dtype).unsqueeze(2)
    decay_BcGrls = _ChunkDecay.apply(Adt_BcHl).unflatten(2, (ngroups, r))
    scores_BcHls = (CB_BcGls.unsqueeze(3) * decay_BcGrls).flatten(2, 3)
    y_diag_BcHlP = scores_BcHls @ X_BclHP.transpose(2, 3)

    # 2. State contributed by each chunk alone, decayed to the chunk's end. The per-head decay goes
    # into x, so the r * headdim rows of a group meet the group's B in one matmul.
    decay_to_end_BclH = torch.exp(Acum_BcHl[..., -1:] - Acum_BcHl).transpose(2, 3)
    if counts_Bcl is not None:  # only the chunk's last document reaches its end
        decay_to_end_BclH = decay_to_end_BclH * (counts_Bcl == counts_Bcl[..., -1:]).to(x.dtype).unsqueeze(-1)
    Xd_BclGR = (X_BclHP * decay_to_end_BclH.unsqueeze(-1)).view(batch, c, l, ngroups, r * headdim)
    chunk_states_BcHPN = (Xd_BclGR.permute(0, 1, 3, 4, 2) @ B_BcGln).view(batch, c, nheads, headdim, d_state)

    # 3. Pass the state across chunks sequentially: linear in the number of chunks.
    chunk_decay_BcH = torch.exp(Acum_BcHl[..., -1])
    if counts_Bcl is not None:  # a flag inside a chunk ends the state that entered it
        chunk_decay_BcH = chunk_decay_BcH * (counts_Bcl[..., -1:] == 0).to(x.dtype)
    # The initial state enters in x's dtype (bf16 under autocast), as the chunk states do; the pass promotes.
    initial_BHPN = None if initial_state_BHPN is None else initial_state_BHPN.to(x.dtype)
    states_in_BcHPN, state = _StatePass.apply(chunk_decay_BcH, chunk_states_BcHPN, initial_BHPN)
    states_in_BcGRN = states_in_BcHPN.view(batch, c, ngroups, r * headdim, d_state)

    # 4. Contribution of the state entering each chunk to the chunk's outputs (C per group again).
    y_off_BclHP = (C_BcGln @ states_in_BcGRN.transpose(-1, -2)).transpose(2, 3).reshape(X_BclHP.shape)
    decay_in_BclH = torch.exp(Acum_BcHl).transpose(2, 3)
    if counts_Bcl is not None:
        decay_in_BclH = decay_in_BclH * (counts_Bcl == 0).to(x.dtype).unsqueeze(-1)
    y_off_BclHP = y_off_BclHP * decay_in_BclH.unsqueeze(-1)

    y_BLHP = (y_off_BclHP + y_diag_BcHlP.transpose(2, 3)).reshape(batch, c * l, nheads, headdim)[:, :length]
    return y_BLHP, state


def ssd_step(
    x_BHP: torch.Tensor,
    dt_BH: torch.Tensor,
    A_H: torch.Tensor,
    B_BGN: torch.Tensor,
    C_BGN: torch.Tensor,
    state_BHPN: torch.Tensor,
    *,
    log_decay_shift: torch.Tensor | None = None,
    norm_max_H: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of the recurrence (generation, and the naive reference). `log_decay_shift` is added to the log
    decay dt A; with `norm_max_H` each head's new state is scaled down to that Frobenius norm where it is above it,
    before it is read (y) and kept."""
    nheads = x_BHP.shape[1]
    dtype = state_BHPN.dtype
    x, dt, A = x_BHP.to(dtype), dt_BH.to(dtype), A_H.to(dtype)
    B = _heads_from_groups(B_BGN.unsqueeze(1), nheads).squeeze(1).to(dtype)
    C = _heads_from_groups(C_BGN.unsqueeze(1), nheads).squeeze(1).to(dtype)
    log_decay_BH = dt * A if log_decay_shift is None else dt * A + log_decay_shift.to(dtype)
    decay_BH = torch.exp(log_decay_BH)
    state = decay_BH[..., None, None] * state_BHPN + (dt[..., None] * x)[..., None] * B[:, :, None, :]
    if norm_max_H is not None:
        state = cap_norm(state, norm_max_H)
    y_BHP = torch.einsum("bhpn,bhn->bhp", state, C)
    return y_BHP, state


def cap_norm(state_BHPN: torch.Tensor, norm_max_H: torch.Tensor) -> torch.Tensor:
    """Each head's state scaled down to Frobenius norm norm_max_H[h] where it is above it; the others unchanged."""
    norm_BH = torch.linalg.vector_norm(state_BHPN, dim=(-2, -1))
    cap_H = norm_max_H.to(state_BHPN.dtype)
    # where, not min(1, cap / norm): a zero state under a zero cap stays zero instead of 0 / 0
    factor_BH = torch.where(norm_BH > cap_H, cap_H / norm_BH, torch.ones_like(norm_BH))
    return state_BHPN * factor_BH[..., None, None]


def ssd_capped(
    x_BLHP: torch.Tensor,
    dt_BLH: torch.Tensor,
    A_H: torch.Tensor,
    B_BLGN: torch.Tensor,
    C_BLGN: torch.Tensor,
    *,
    norm_max_H: torch.Tensor,
    initial_state_BHPN: torch.Tensor | None = None,
    resets_BL: torch.Tensor | None = None,
    log_decay_shift: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrence with each head's state norm capped after every token (Stuffed Mamba's state normalisation,
    applied per token): L sequential steps in float32, as ssd_chunked's inputs and outputs. Capping per token keeps
    a split call equal to one call (the state carried between them is the capped one). `resets_BL`: h is zero before
    each flagged position."""
    batch, length, nheads, headdim = x_BLHP.shape
    state = x_BLHP.new_zeros(batch, nheads, headdim, B_BLGN.shape[-1], dtype=torch.float32) \
        if initial_state_BHPN is None else up(initial_state_BHPN)
    x, dt, A, B, C = up(x_BLHP), up(dt_BLH), up(A_H), up(B_BLGN), up(C_BLGN)
    ys = []
    for t in range(length):
        if resets_BL is not None:
            state = state * (~resets_BL[:, t]).to(state.dtype)[:, None, None, None]
        y, state = ssd_step(x[:, t], dt[:, t], A, B[:, t], C[:, t], state, log_decay_shift=log_decay_shift,
                            norm_max_H=norm_max_H)
        ys.append(y)
    return torch.stack(ys, dim=1), state


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
