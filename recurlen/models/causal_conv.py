"""The short depthwise causal conv that Mamba-1, Mamba-2 and GLA (with short convs) put before their scan,
continuing from a carried window of the last W = width - 1 inputs. Two paths, one result:

    causal_conv(...)         pure PyTorch, d_conv shifted multiply-adds (CPU, tests)
    causal_conv_kernel(...)  causal-conv1d's CUDA kernel with initial / final states, + SiLU; None when it is
                             not installed or the layout does not suit it (the caller then takes the PyTorch path)
"""

from __future__ import annotations

import functools
import logging

import torch

from recurlen.models.resets import document_age

log = logging.getLogger(__name__)


class _ShiftConv(torch.autograd.Function):
    """out[t] = sum_k weight[k] * x_pad[t + k] (+ bias), depthwise, as d_conv shifted multiply-adds.

    F.conv1d(groups=C) is slow on CPU, and autograd through d_conv slices of x_pad zero-fills a
    padded-size gradient per slice; the backward here is the same shift-adds, run in place.
    """

    @staticmethod
    def forward(ctx, x_pad_BLC: torch.Tensor, weight_KC: torch.Tensor, bias_C: torch.Tensor | None) -> torch.Tensor:
        width = weight_KC.shape[0]
        length = x_pad_BLC.shape[1] - width + 1
        out_BLC = x_pad_BLC[:, 0:length] * weight_KC[0]
        for k in range(1, width):
            out_BLC.addcmul_(x_pad_BLC[:, k:k + length], weight_KC[k])
        if bias_C is not None:
            out_BLC += bias_C
        ctx.save_for_backward(x_pad_BLC, weight_KC)
        ctx.has_bias = bias_C is not None
        return out_BLC

    @staticmethod
    def backward(ctx, grad_BLC: torch.Tensor):
        x_pad_BLC, weight_KC = ctx.saved_tensors
        width, length = weight_KC.shape[0], grad_BLC.shape[1]
        grad_x_pad = torch.zeros_like(x_pad_BLC)
        grad_weight = torch.empty_like(weight_KC)
        for k in range(width):
            grad_x_pad[:, k:k + length].addcmul_(grad_BLC, weight_KC[k])
            grad_weight[k] = (grad_BLC * x_pad_BLC[:, k:k + length]).sum((0, 1))
        return grad_x_pad, grad_weight, grad_BLC.sum((0, 1)) if ctx.has_bias else None


def causal_conv(x_BLC: torch.Tensor, weight_CK: torch.Tensor, bias_C: torch.Tensor | None,
                conv_state_BCW: torch.Tensor, *,
                resets_BL: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv continuing from the last W inputs (carrying the window is a concat). With `resets_BL`
    (True where a document starts, recurlen.models.resets) no tap reads an input of an earlier document, and the
    window handed on holds the last document's inputs only."""
    width = weight_CK.shape[1]
    x_pad_BLC = torch.cat([conv_state_BCW.transpose(1, 2).to(x_BLC.dtype), x_BLC], dim=1)
    if resets_BL is not None:
        return _reset_conv(x_pad_BLC, weight_CK, bias_C, resets_BL)
    # weight_CK[:, k] is a strided column: contiguous taps make every multiply ~2x faster.
    out_BLC = _ShiftConv.apply(x_pad_BLC, weight_CK.t().contiguous(), bias_C)
    return out_BLC, x_pad_BLC[:, -(width - 1):].transpose(1, 2)


def _reset_conv(x_pad_BLC: torch.Tensor, weight_CK: torch.Tensor, bias_C: torch.Tensor | None,
                resets_BL: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The conv as if each document started from a zero window: the plain conv, less the taps that read an earlier
    document. Only the W positions after each flag have such taps, so the correction is gathered there alone
    (a few positions per document) instead of masking every tap everywhere."""
    width = weight_CK.shape[1]
    w = width - 1
    weight_KC = weight_CK.t().contiguous()
    out_BLC = _ShiftConv.apply(x_pad_BLC, weight_KC, bias_C)
    age_BL = document_age(resets_BL, w)
    rows, cols = (age_BL < w).nonzero(as_tuple=True)
    if rows.numel():
        taps = torch.arange(width, device=rows.device)
        x_nKC = x_pad_BLC[rows.unsqueeze(1), cols.unsqueeze(1) + taps]  # tap k of output t reads x_pad[t + k]
        # Tap k reads W - k positions back: another document's where the position's document is younger.
        earlier_nK = age_BL[rows, cols].unsqueeze(1) < w - taps
        correction_nC = (x_nKC * weight_KC * earlier_nK.unsqueeze(-1).to(x_nKC.dtype)).sum(dim=1)
        out_BLC = out_BLC.index_put((rows, cols), -correction_nC, accumulate=True)
    # Window entry i is the input W - 1 - i positions before the last: kept where the last document reaches it.
    keep_BW1 = age_BL[:, -1:].unsqueeze(-1) >= torch.arange(w - 1, -1, -1, device=age_BL.device).view(1, w, 1)
    return out_BLC, (x_pad_BLC[:, -w:] * keep_BW1.to(x_pad_BLC.dtype)).transpose(1, 2)


@functools.lru_cache(maxsize=1)
def _causal_conv1d():
    try:
        from causal_conv1d import causal_conv1d_fn
    except Exception as err:
        log.info("causal-conv1d not usable (%s); the kernel backend uses the PyTorch conv", err)
        return None
    return causal_conv1d_fn


def causal_conv_kernel(x_BLC: torch.Tensor, weight_CK: torch.Tensor, bias_C: torch.Tensor | None,
                       conv_state_BCW: torch.Tensor):
    """Conv + SiLU with initial/final states, or None when causal-conv1d is not installed."""
    fn = _causal_conv1d()
    if fn is None:
        return None
    # causal-conv1d takes initial states only in channel-last layout (stride 1 over channels), with the
    # other strides multiples of 8. x is a column slice of in_proj's output: made contiguous its
    # strides are (L*C, C, 1), so the channel count decides; otherwise the PyTorch conv does the work.
    if x_BLC.shape[-1] % 8:
        return None
    x_BCL = x_BLC.contiguous().transpose(1, 2)
    init_BCW = conv_state_BCW.to(x_BLC.dtype).transpose(1, 2).contiguous().transpose(1, 2)
    out_BCL, final_BCW = fn(x_BCL, weight_CK, bias_C, initial_states=init_BCW, return_final_states=True,
                            activation="silu")
    return out_BCL.transpose(1, 2), final_BCW


__all__ = ["causal_conv", "causal_conv_kernel"]
