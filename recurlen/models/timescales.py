"""Scales on a recurrent model's timescales, per layer: the discretisation step dt and the decay A.

Training-free length fixes (recurlen.evaluation.fixes) change how fast a model forgets without training it:
MambaExtend scales dt, spectrum scaling scales A. An architecture offers this by naming what its mixers scale in
`TIMESCALES` on its LM class, and by reading two attributes of each mixer where it forms dt and A:

    dt = scaled(softplus(...), mixer.dt_scale)        A = scaled(-exp(A_log), mixer.A_scale)

    "dt"      the mixer reads `dt_scale` (None or a scalar tensor) wherever it forms dt (scan, kernel, step)
    "A"       the mixer reads `A_scale` likewise wherever it forms A
    "A_log"   the decays are parameters: the mixer has `A_log` and `decay_rates()` (each state entry's rate per
              token at zero input, shaped as A_log followed by the dims its entries share), so a per-entry change of
              A can be folded into A_log (what a checkpoint and an export keep)

The scales are plain attributes, not parameters or buffers: state_dict, checkpoints and the official format are
the model's own, and a scale of None costs nothing. A scale that the official format cannot express (dt) lives only
on the loaded model; `fold_A_scales` moves the A scales into A_log, exactly (A = -exp(A_log)).
"""

from __future__ import annotations

import torch
import torch.nn as nn

KNOBS = ("dt", "A", "A_log")


def knobs(model_or_cls) -> tuple[str, ...]:
    """What an LM class (or model) lets a fix scale: a subset of KNOBS; () where it offers none."""
    cls = model_or_cls if isinstance(model_or_cls, type) else type(model_or_cls)
    return tuple(getattr(cls, "TIMESCALES", ()))


def mixers(model: nn.Module) -> list[nn.Module]:
    """Each layer's mixer, in order."""
    return [block.mixer for block in model.layers]


def scaled(value: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """value x scale, or value itself when there is no scale (the model as trained, bit for bit)."""
    return value if scale is None else value * scale


def softplus_inverse(y: torch.Tensor) -> torch.Tensor:
    """x with softplus(x) = y > 0: what a kernel that forms softplus(dt_raw + dt_bias) itself is given for a dt
    already formed (and scaled) outside it, with dt_bias zero."""
    return y + torch.log(-torch.expm1(-y))


def set_scales(model: nn.Module, knob: str, scales_K: torch.Tensor | None) -> None:
    """Set every layer's `dt_scale` or `A_scale` (scales_K: one value per layer, kept in the graph so that a
    calibration can differentiate through it; None: remove the scales)."""
    if knob not in ("dt", "A") or knob not in knobs(model):
        raise ValueError(f"{type(model).__name__} does not scale {knob!r}; it scales {list(knobs(model))}")
    layers = mixers(model)
    if scales_K is not None and scales_K.shape != (len(layers),):
        raise ValueError(f"{knob} scales: need one per layer ({len(layers)}); got shape {tuple(scales_K.shape)}")
    for i, mixer in enumerate(layers):
        setattr(mixer, f"{knob}_scale", None if scales_K is None else scales_K[i])


@torch.no_grad()
def fold_A_scales(model: nn.Module) -> bool:
    """Move each layer's A scale into its A_log (A_log + log s gives A x s exactly); True if the model has A_log."""
    if "A_log" not in knobs(model):
        return False
    for mixer in mixers(model):
        if mixer.A_scale is not None:
            mixer.A_log.add_(torch.log(mixer.A_scale.detach().to(mixer.A_log)))
            mixer.A_scale = None
    return True


__all__ = ["KNOBS", "fold_A_scales", "knobs", "mixers", "scaled", "set_scales", "softplus_inverse"]
