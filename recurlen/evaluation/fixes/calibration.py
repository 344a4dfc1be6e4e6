"""The calibration loss of a training-free fix, and the two ways to lower it: zeroth-order (SPSA) and gradients.

    loss = calibration_loss(model, seqs_NL, chunk_len=256, batch_size=8)    # mean next-token NLL, nats
    theta, record = spsa(loss_of, theta0, cfg, seed=0)                      # loss_of(theta) -> float

The loss is the one the fixes are judged by: next-token NLL over whole held-out sequences of the target length,
run in chunks with the state carried (memory independent of the length), from a zero initial state.

SPSA has the form of MambaExtend's calibration (Azizi et al., ICLR 2025): each step perturbs every scale at once by
+-c_k (a random sign per scale), estimates the gradient from the two losses and steps against it; c_k = c_0 /
(1 + k)^0.1 as there. The rest is recurlen's: the scales are searched in log space (s = exp(theta)), so that +-c is
a relative change of every scale alike and no scale reaches zero; the step size decays as a cosine to ~0 at the last
step (MambaExtend's cosine ends at 0.71 of its start); and the search keeps the lowest loss measured so far, among the
start and every stepped and perturbed point (MambaExtend moves to the stepped point unless a perturbed one measured
lower). docs/evaluation.md lists every difference from MambaExtend's code.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F


def calibration_loss(model: torch.nn.Module, seqs_NL: torch.Tensor, *, chunk_len: int, batch_size: int) -> torch.Tensor:
    """Mean next-token NLL (nats) of the sequences, chunked with the state carried; differentiable when grad is on
    (backpropagation through the whole sequence: memory grows with the length)."""
    total = seqs_NL.new_zeros((), dtype=torch.float64)
    count = 0
    for lo in range(0, seqs_NL.shape[0], batch_size):
        ids = seqs_NL[lo:lo + batch_size]
        state = None
        for start in range(0, ids.shape[1] - 1, chunk_len):
            inp = ids[:, start:min(start + chunk_len, ids.shape[1] - 1)]
            tgt = ids[:, start + 1:start + 1 + inp.shape[1]]
            logits, state = model(inp, state)
            total = total + F.cross_entropy(logits.float().flatten(0, 1), tgt.flatten(), reduction="sum")
            count += tgt.numel()
    return total / count


@dataclass
class Trace:
    """What a calibration did: the loss before and after, each step's best loss, forward passes, seconds."""

    loss_before: float
    loss_after: float
    losses: list[float]
    forward_passes: int
    seconds: float

    def to_dict(self) -> dict:
        return {"loss_before": self.loss_before, "loss_after": self.loss_after, "losses": self.losses,
                "forward_passes": self.forward_passes, "seconds": self.seconds}


def spsa(loss_of: Callable[[torch.Tensor], float], theta0: torch.Tensor, *, steps: int, lr: float, perturb: float,
         seed: int, bounds: tuple[float, float]) -> tuple[torch.Tensor, Trace]:
    """Minimise loss_of over theta (a vector) with SPSA; returns the best theta measured and the trace."""
    started = time.perf_counter()
    gen = torch.Generator().manual_seed(seed)
    theta = theta0.detach().clone().float()
    best = loss_of(theta)
    before, passes, losses = best, 1, []
    for k in range(steps):
        c = perturb / (1 + k) ** 0.1
        a = lr * math.cos(k * math.pi / (2 * max(steps, 1)))  # decays to ~0 at the last step
        sign = torch.randint(0, 2, theta.shape, generator=gen).float() * 2 - 1
        plus, minus = (theta + c * sign).clamp(*bounds), (theta - c * sign).clamp(*bounds)
        loss_plus, loss_minus = loss_of(plus), loss_of(minus)
        stepped = (theta - a * (loss_plus - loss_minus) / (2 * c) * sign).clamp(*bounds)
        loss_stepped = loss_of(stepped)
        passes += 3
        for cand, loss in ((stepped, loss_stepped), (plus, loss_plus), (minus, loss_minus)):
            if loss < best:
                theta, best = cand, loss
        losses.append(best)
    return theta, Trace(before, best, losses, passes, time.perf_counter() - started)


def gradient_descent(loss_fn: Callable[[torch.Tensor], torch.Tensor], theta0: torch.Tensor, *, steps: int, lr: float,
                     bounds: tuple[float, float]) -> tuple[torch.Tensor, Trace]:
    """Minimise loss_fn (differentiable in theta) with Adam; returns the best theta measured and the trace."""
    started = time.perf_counter()
    theta = theta0.detach().clone().float().requires_grad_(True)
    opt = torch.optim.Adam([theta], lr=lr)
    best_theta, best, before, losses = theta.detach().clone(), math.inf, None, []
    for _ in range(steps + 1):  # the last pass only measures the last step's point
        opt.zero_grad()
        loss = loss_fn(theta)
        value = float(loss.detach())
        before = value if before is None else before
        if value < best:
            best_theta, best = theta.detach().clone(), value
        losses.append(best)
        if len(losses) > steps:
            break
        loss.backward()
        opt.step()
        with torch.no_grad():
            theta.clamp_(*bounds)
    return best_theta, Trace(before, best, losses[1:], steps + 1, time.perf_counter() - started)


__all__ = ["Trace", "calibration_loss", "gradient_descent", "spsa"]
