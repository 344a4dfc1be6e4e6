"""The A knob (recurlen.models.timescales) on a kernel path, under Triton's interpreter (make test-kernels): the model
with every layer's A scale s run by backend="kernel" against backend="torch" with the same scale. Each architecture's
folder (tests/models/<arch>/test_<arch>_scaled_decay_kernels_cpu.py) calls it with its own model, its recurrent state
part and its folder's kernel tolerances."""

from __future__ import annotations

import torch

from recurlen.models import timescales
from recurlen.training.lit_module import token_loss


def scaled_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """max |got - ref| / max |ref|."""
    return float((got.double() - ref.double()).abs().max() / ref.double().abs().max().clamp_min(1e-6))


def run_scaled(model, ids: torch.Tensor, init, s: float, backend: str, recurrent: str):
    """Logits, final state and the gradient of the loss (next-token loss + the mean square of the final recurrent
    state, so the kernel's backward from the final state counts too) with respect to the per-layer scales, which a
    gradient calibration (recurlen.evaluation.fixes.calibration) descends; the scales are removed afterwards."""
    scales_K = torch.full((len(timescales.mixers(model)),), s, requires_grad=True)
    timescales.set_scales(model, "A", scales_K)
    try:
        logits, final = model(ids, init, backend=backend)
        loss = token_loss(logits[:, :-1], ids[:, 1:], None) + getattr(final, recurrent).pow(2).mean()
        (grad_K,) = torch.autograd.grad(loss, scales_K, allow_unused=True)  # unused: a path that drops the scale
    finally:
        timescales.set_scales(model, "A", None)
    return logits.detach(), final.detach(), torch.zeros_like(scales_K) if grad_K is None else grad_K


def check_scaled_kernel_equals_torch(model, ids: torch.Tensor, init, s: float, *, close, recurrent: str, tol: float,
                                     grad_tol: float, unscaled_logits: torch.Tensor, what: str) -> None:
    """At scale s the kernel's logits, final `recurrent` state and scale gradient equal the torch path's (`close`:
    the close_scaled fixture), and its logits are far from the unscaled kernel's (the scale reached the kernel)."""
    ref_logits, ref_state, ref_grad = run_scaled(model, ids, init, s, "torch", recurrent)
    logits, state, grad = run_scaled(model, ids, init, s, "kernel", recurrent)
    moved = scaled_error(logits, unscaled_logits)
    print(f"\n{what} at s = {s}, kernel vs torch (error / max |torch|): logits {scaled_error(logits, ref_logits):.1e}, "
          f"{recurrent} {scaled_error(getattr(state, recurrent), getattr(ref_state, recurrent)):.1e}, d loss / d s "
          f"{scaled_error(grad, ref_grad):.1e}; the logits moved {moved:.1e} from the unscaled kernel's")
    close(logits, ref_logits, tol, f"logits at s = {s}")
    assert getattr(state, recurrent).dtype == torch.float32
    close(getattr(state, recurrent), getattr(ref_state, recurrent), tol, f"final {recurrent} state at s = {s}")
    assert float(ref_grad.abs().max()) > 0, "the loss does not depend on the scales"
    close(grad, ref_grad, grad_tol, f"gradient of the scales at s = {s}")
    assert moved > 20 * tol, f"the kernel's logits at s = {s} are within {moved:.1e} of the unscaled kernel's"


__all__ = ["check_scaled_kernel_equals_torch", "run_scaled", "scaled_error"]
