"""The LM head and its next-token cross-entropy in chunks of positions, so that the whole logits never exist.

    loss = chunked_head_loss(hidden_ND, weight_VD, targets_N, weights_N, rows=vocab_size)
         = sum_i weights_i * CE(hidden_i @ weight[:rows].T, targets_i)      (CE in float32, as token_loss does)

At the 130m shape and 8 x 2048 tokens the float32 logits of the plain path are 16384 x 50277 x 4 bytes = 3.1 GiB, and
their softmax gradient as much again: more than the rest of the step's activations. Here each chunk of positions
makes its logits, its loss and, in the same pass, its gradient (softmax - one-hot, times the token's weight): the
gradients of the hidden states and of the head's weight are kept and the chunk's logits freed. The backward only
scales them by the incoming gradient (a scalar). The matmuls are the plain path's (one forward, two backward per
position), so nothing is recomputed; the cost is holding the weight's gradient (rows x D, float32) from the loss's
forward until the backward reaches the head, which the backward would allocate anyway.

Under autocast the head's products run in the autocast dtype, as F.linear would; the softmax and the loss in
float32, as token_loss does after `.float()`. Legend: N positions (batch x length, flattened), D model width,
V the head's rows (the padded vocabulary), R the rows scored (vocab_size).
"""

from __future__ import annotations

import torch

CHUNK_BYTES = 64 * 2**20
"""float32 logits per chunk (333 positions of a 50k vocabulary): large enough that each chunk's three products keep
a GPU busy, small next to the 3 GiB of the whole logits at the 130m shape; also the size past which
`trainer.chunked_loss=auto` chunks (a micro-batch whose logits fit in one chunk gains nothing)."""
HEAD_LOSSES = ("auto", "chunked", "plain")
"""trainer.head_loss: where a training step computes its loss without the whole logits (lit_module.head_token_loss)."""
IGNORE_INDEX = -100  # F.cross_entropy's default: such targets score 0, as in token_loss


def chunk_positions(rows: int, *, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Positions per chunk whose float32 logits take at most chunk_bytes."""
    return max(1, chunk_bytes // (4 * rows))


def logits_exceed_one_chunk(positions: int, rows: int, *, chunk_bytes: int = CHUNK_BYTES) -> bool:
    return positions > chunk_positions(rows, chunk_bytes=chunk_bytes)


class _ChunkedHeadLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden_ND: torch.Tensor, weight_VD: torch.Tensor, targets_N: torch.Tensor,
                weights_N: torch.Tensor, rows: int, chunk: int) -> torch.Tensor:
        ctx.dtypes = (hidden_ND.dtype, weight_VD.dtype)
        device = hidden_ND.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden_ND.dtype
        # The casts are explicit, so autocast is off inside (it also refuses the out= products)
        with torch.autocast(device, enabled=False):
            return _ChunkedHeadLoss._chunks(ctx, hidden_ND, weight_VD, targets_N, weights_N, rows, chunk, dtype)

    @staticmethod
    def _chunks(ctx, hidden_ND: torch.Tensor, weight_VD: torch.Tensor, targets_N: torch.Tensor,
                weights_N: torch.Tensor, rows: int, chunk: int, dtype: torch.dtype) -> torch.Tensor:
        # The softmax in float32 (token_loss's .float()), or in float64 for a float64 head
        acc = torch.promote_types(dtype, torch.float32)
        head_RD = weight_VD[:rows].to(dtype)
        hidden_ND = hidden_ND.to(dtype)
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden_ND = torch.empty_like(hidden_ND) if need_hidden else None
        # The weight's gradient summed over the chunks in float32 (float64) whatever the compute dtype
        grad_weight_VD = (torch.zeros(weight_VD.shape, dtype=acc, device=weight_VD.device)
                          if need_weight else None)
        loss = torch.zeros((), dtype=acc, device=hidden_ND.device)
        for start in range(0, hidden_ND.shape[0], chunk):
            h_nD = hidden_ND[start:start + chunk]
            t_n = targets_N[start:start + chunk]
            valid_n = t_n != IGNORE_INDEX
            t_n = t_n.where(valid_n, 0)
            w_n = weights_N[start:start + chunk].to(acc) * valid_n
            logits_nR = (h_nD @ head_RD.t()).to(acc)
            lse_n = torch.logsumexp(logits_nR, dim=-1)
            nll_n = lse_n - logits_nR.gather(1, t_n[:, None]).squeeze(1)
            loss += (nll_n * w_n).sum()
            if not (need_hidden or need_weight):
                continue
            # d loss / d logits = w * (softmax - one-hot), made in the logits' own storage
            grad_nR = logits_nR.sub_(lse_n[:, None]).exp_()
            grad_nR[torch.arange(t_n.shape[0], device=t_n.device), t_n] -= 1.0
            grad_nR.mul_(w_n[:, None])
            grad_nR = grad_nR.to(dtype)
            if need_hidden:
                torch.mm(grad_nR, head_RD, out=grad_hidden_ND[start:start + chunk])
            if need_weight and dtype == acc:  # in place: a product of the weight's size per chunk would double it
                grad_weight_VD[:rows].addmm_(grad_nR.t(), h_nD)
            elif need_weight:
                grad_weight_VD[:rows].add_(grad_nR.t().mm(h_nD))
        ctx.save_for_backward(grad_hidden_ND, grad_weight_VD)
        ctx.backward_done = False
        return loss

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        if ctx.backward_done:
            raise RuntimeError("chunked_head_loss: its backward runs once (it scales the gradients it made in place)")
        ctx.backward_done = True
        grad_hidden_ND, grad_weight_VD = ctx.saved_tensors
        hidden_dtype, weight_dtype = ctx.dtypes
        # In place: a scaled copy would hold the weight's gradient twice at the peak
        grad_hidden = None if grad_hidden_ND is None else grad_hidden_ND.mul_(grad_loss).to(hidden_dtype)
        grad_weight = None if grad_weight_VD is None else grad_weight_VD.mul_(grad_loss).to(weight_dtype)
        return grad_hidden, grad_weight, None, None, None, None


def chunked_head_loss(hidden_ND: torch.Tensor, weight_VD: torch.Tensor, targets_N: torch.Tensor,
                      weights_N: torch.Tensor, *, rows: int, chunk: int | None = None) -> torch.Tensor:
    """sum_i weights_i x CE(hidden_i @ weight[:rows].T, targets_i), float32, without the (N, rows) logits; targets
    equal to -100 score 0. chunk: positions per chunk (default: 64 MiB of float32 logits)."""
    if hidden_ND.dim() != 2 or targets_N.shape != hidden_ND.shape[:1] or weights_N.shape != targets_N.shape:
        raise ValueError(f"chunked_head_loss takes hidden (N, D), targets (N,), weights (N,); got "
                         f"{tuple(hidden_ND.shape)}, {tuple(targets_N.shape)}, {tuple(weights_N.shape)}")
    return _ChunkedHeadLoss.apply(hidden_ND, weight_VD, targets_N, weights_N.detach(), rows,
                                  chunk or chunk_positions(rows))


def chunked_token_loss(model, hidden_BLD: torch.Tensor, targets_BL: torch.Tensor,
                       mask_BL: torch.Tensor | None, *, chunk: int | None = None) -> torch.Tensor:
    """token_loss(model.logits_from_hidden(hidden), targets, mask) without the logits: the mean cross-entropy over
    the scored tokens (all, or those where mask is True) of a StatefulLM's head, `chunk` positions at a time."""
    targets_N = targets_BL.reshape(-1)
    if mask_BL is None:
        weights_N = torch.full(targets_N.shape, 1.0 / targets_N.numel(), device=targets_N.device)
    else:
        mask_N = mask_BL.reshape(-1).float()
        weights_N = mask_N / mask_N.sum().clamp_min(1.0)
    return chunked_head_loss(hidden_BLD.reshape(-1, hidden_BLD.shape[-1]), model.lm_head.weight, targets_N,
                             weights_N, rows=model.head_rows, chunk=chunk)


__all__ = ["CHUNK_BYTES", "HEAD_LOSSES", "chunk_positions", "chunked_head_loss", "chunked_token_loss",
           "logits_exceed_one_chunk"]
