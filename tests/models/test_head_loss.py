"""The LM head's loss in chunks of positions (recurlen.models.head_loss) == the plain logits + cross-entropy:
the same loss and gradients (float64 against the exact math, float32 against training's token_loss), and the whole
logits never exist."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from recurlen.models.head_loss import chunked_head_loss, chunked_token_loss
from recurlen.training.lit_module import token_loss

N, D, V, ROWS, CHUNK = 37, 16, 72, 67, 5  # 8 chunks, the last partial; 5 padded head rows never scored


def inputs(dtype: torch.dtype, *, masked: bool):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(N, D, generator=g, dtype=dtype, requires_grad=True)
    weight = (torch.randn(V, D, generator=g, dtype=dtype) * 0.5).requires_grad_()
    targets = torch.randint(0, ROWS, (N,), generator=g)
    targets[3] = -100  # cross_entropy's ignore_index scores 0
    mask = (torch.rand(N, generator=g) > 0.3) if masked else None
    return hidden, weight, targets, mask


def plain(hidden, weight, targets, mask, *, float32: bool):
    logits = F.linear(hidden, weight[:ROWS])
    if float32:  # exactly what training computed before: lit_module.token_loss on the logits
        return token_loss(logits[None], targets[None], None if mask is None else mask[None])
    nll = F.cross_entropy(logits, targets, reduction="none")
    return nll.mean() if mask is None else (nll * mask).sum() / mask.sum()


def chunked(hidden, weight, targets, mask):
    if mask is None:
        weights = torch.full((N,), 1.0 / N, dtype=hidden.dtype)
    else:
        weights = mask.to(hidden.dtype) / mask.sum()
    return chunked_head_loss(hidden, weight, targets, weights, rows=ROWS, chunk=CHUNK)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 2e-6)])
def test_chunked_head_loss_equals_the_plain_loss_and_gradients(dtype, tol, masked, close_scaled):
    hidden, weight, targets, mask = inputs(dtype, masked=masked)
    ref = plain(hidden, weight, targets, mask, float32=dtype == torch.float32)
    ref_grads = torch.autograd.grad(ref * 3.0, (hidden, weight))  # a scale, so backward's grad_output is used
    got = chunked(hidden, weight, targets, mask)
    grads = torch.autograd.grad(got * 3.0, (hidden, weight))
    assert got.dtype == ref.dtype
    close_scaled(got, ref, tol, "loss")
    close_scaled(grads[0], ref_grads[0], tol, "gradient of the hidden states")
    close_scaled(grads[1], ref_grads[1], tol, "gradient of the head's weight")
    assert grads[1][ROWS:].abs().max() == 0  # padded rows are never scored


def test_under_bf16_autocast_the_chunked_loss_is_the_plain_ones(close_scaled):
    """The head's products in bf16 as F.linear's under autocast, the softmax in float32 as token_loss's."""
    hidden, weight, targets, _ = inputs(torch.float32, masked=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = plain(hidden, weight, targets, None, float32=True)
        got = chunked(hidden, weight, targets, None)
    ref_grads = torch.autograd.grad(ref, (hidden, weight))
    grads = torch.autograd.grad(got, (hidden, weight))
    assert got.dtype == torch.float32 and grads[0].dtype == grads[1].dtype == torch.float32
    close_scaled(got, ref, 1e-3, "loss")
    close_scaled(grads[0], ref_grads[0], 2e-2, "gradient of the hidden states")
    close_scaled(grads[1], ref_grads[1], 2e-2, "gradient of the head's weight")


def test_chunked_head_loss_without_grad_is_the_loss_alone():
    hidden, weight, targets, _ = inputs(torch.float64, masked=False)
    with torch.no_grad():
        got = chunked(hidden, weight, targets, None)
        ref = plain(hidden, weight, targets, None, float32=False)
    assert abs(float(got - ref)) <= 1e-12 * abs(float(ref))


class LargestResult(TorchDispatchMode):
    """The largest number of elements any op produced (forward and backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_no_tensor_of_the_whole_logits_exists():
    hidden, weight, targets, _ = inputs(torch.float32, masked=False)
    with LargestResult() as seen:
        chunked(hidden, weight, targets, None).backward()
    assert seen.largest <= max(CHUNK * ROWS, V * D), seen.largest
    with LargestResult() as seen_plain:  # the plain path makes the whole (N, ROWS) logits: the check can fail
        plain(hidden, weight, targets, None, float32=True).backward()
    assert seen_plain.largest >= N * ROWS


@pytest.mark.parametrize("masked", [False, True])
def test_chunked_token_loss_of_a_model_equals_token_loss(nano_model, masked, close_scaled):
    """The model's whole step: same loss and the same gradient for every parameter (tied head and embedding)."""
    model = nano_model("mamba2").train()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (3, 21), generator=g)
    targets = torch.randint(0, model.config.vocab_size, (3, 21), generator=g)
    mask = (torch.rand(3, 21, generator=g) > 0.5) if masked else None

    def run(loss_fn):
        model.zero_grad(set_to_none=True)
        hidden, _ = model.forward_hidden(ids)
        loss = loss_fn(hidden)
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    ref, ref_grads = run(lambda h: token_loss(model.logits_from_hidden(h), targets, mask))
    got, grads = run(lambda h: chunked_token_loss(model, h, targets, mask, chunk=CHUNK))
    close_scaled(got, ref, 1e-6, "loss")
    for name, grad in ref_grads.items():
        close_scaled(grads[name], grad, 1e-5, f"gradient of {name}")
