"""Scales on a recurrent model's timescales, per layer: the discretisation step dt and the decay A.

Training-free length fixes (recurlen.evaluation.fixes) change how fast a model forgets without training it:
MambaExtend scales dt, spectrum scaling scales A. An architecture offers this by naming what its mixers scale in
`TIMESCALES` on its LM class, and by reading two attributes of each mixer where it forms dt and A:

    dt = scaled(softplus(...), mixer.dt_scale)        A = scaled(-exp(A_log), mixer.A_scale)

    "dt"      the mixer reads `dt_scale` (None or a scalar tensor) wherever it forms dt (scan, kernel, step)
    "A"       the mixer reads `A_scale` likewise wherever it forms A: a scale of each token's log decay (on Mamba
              dt A with A scaled; on GLA, RWKV-6, Gated DeltaNet and RWKV-7 their per-channel / per-head log decay)
    "A_log"   the decays' rates are parameters in log space: the mixer has one (`A_log`, or the parameter its class
              names in LOG_RATE: RWKV-6's time_decay; `log_rate(mixer)`) and `decay_rates()` (each state entry's rate
              per token at zero input, shaped as that parameter followed by the dims its entries share), so a
              per-entry change of A can be folded into it exactly (what a checkpoint and an export keep)
    "B"       the mixer reads `B_scale` (None or a scalar tensor) and multiplies B by it wherever it forms B (scan,
              kernel, step): the input dt x B^T enters the state scaled, the decay does not move
    "decay"   the mixer reads `decay_scale` (None or a scalar tensor) and multiplies each token's decay exp(dt A) by
              it, i.e. adds log(decay_scale) to the log decay dt A (in its chunked scan and its step; where a kernel
              takes dt and A apart and cannot form it, the layer runs its PyTorch scan)
    "state_norm" the mixer reads `state_norm_max` (None or a cap per head, (H,)) and, after every token, scales
              each head's state down to that Frobenius norm where it is above it (a token-by-token scan: the cap is
              not linear in the state, so there is no chunked form)

    "dt_select" the mixer reads `dt_select` (None, or a dt threshold per channel: per inner channel on Mamba-1, per
              head on Mamba-2, whose dt is per head) and sets dt to 0 wherever it is not above its channel's threshold
              (`select_tokens`; scan, kernel and step): such a token leaves that channel's state as it was, decay
              exp(0 A) = 1 and input 0 B x = 0 (LongMamba's token filter, recurlen.evaluation.fixes.token_selection);
              a threshold of 0 filters nothing. The mixer's `dt_probe()` gives what the calibration reads: the
              submodule whose output holds the raw dt, the map from that output to dt (before the filter) and each
              channel's slowest decay per unit dt. Mamba-3 does not offer it (recurlen.models.mamba3.model says why)

GLA, RWKV-6, Gated DeltaNet and RWKV-7 offer no "dt": none has a dt that also scales the input (RWKV and GLA have
no dt; Gated DeltaNet's dt multiplies the decay alone, so a dt scale would be an A scale).

"B", "decay" and "state_norm" are Stuffed Mamba's knobs (recurlen.evaluation.fixes.stuffed_mamba; its dt and A
multipliers are the "dt" and "A" scales with one value on every layer).

The scales are plain attributes, not parameters or buffers: state_dict, checkpoints and the official format are
the model's own, and a scale of None costs nothing. A scale that the official format cannot express (dt) lives only
on the loaded model; `fold_A_scales` moves the A scales into A_log, exactly (A = -exp(A_log)). Writing the weights
(`prepare_to_write`, called by the official and transformers writers) folds an A scale and refuses a dt scale, and
refuses a B scale (B comes out of the convolution and its SiLU: no linear map holds it), a decay scale (the log decay
dt A + log s is no dt' A of a softplus dt'), a state norm cap (no format has one) and a token filter (a rule per token
on dt, not a weight).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from recurlen.util.errors import UserError

KNOBS = ("dt", "A", "A_log", "B", "decay", "state_norm", "dt_select")
SCALED = {"dt": "dt_scale", "A": "A_scale", "B": "B_scale", "decay": "decay_scale"}
"""The knobs that are one scale per layer, and the mixer attribute each sets."""


def knobs(model_or_cls) -> tuple[str, ...]:
    """What an LM class (or model) lets a fix scale: a subset of KNOBS; () where it offers none."""
    cls = model_or_cls if isinstance(model_or_cls, type) else type(model_or_cls)
    return tuple(getattr(cls, "TIMESCALES", ()))


def mixers(model: nn.Module) -> list[nn.Module]:
    """Each layer's mixer, in order: mamba-ssm's blocks call it `mixer`, fla's `attn` (RWKV: the time mix)."""
    return [block.mixer if hasattr(block, "mixer") else block.attn for block in model.layers]


def log_rate(mixer: nn.Module) -> nn.Parameter:
    """The mixer's decay rates in log space (knob "A_log"): `A_log`, or the parameter its class names in LOG_RATE;
    adding log s to an entry multiplies that entry's log decay by s, for every input."""
    return mixer.get_parameter(getattr(mixer, "LOG_RATE", "A_log"))


def scaled(value: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """value x scale, or value itself when there is no scale (the model as trained, bit for bit)."""
    return value if scale is None else value * scale


def softplus_inverse(y: torch.Tensor) -> torch.Tensor:
    """x with softplus(x) = y > 0: what a kernel that forms softplus(dt_raw + dt_bias) itself is given for a dt
    already formed (and scaled) outside it, with dt_bias zero."""
    return y + torch.log(-torch.expm1(-y))


DT_OFF = -1.0e4
"""The raw dt a kernel is given for a filtered token: softplus(-1e4) is exactly 0 in float32 (exp underflows), where
softplus_inverse(0) would be -inf."""


def kernel_dt(dt: torch.Tensor) -> torch.Tensor:
    """What a kernel that forms softplus(raw + 0) itself is given for a dt formed outside it (scaled, filtered):
    softplus_inverse(dt), and DT_OFF where dt is 0."""
    return torch.where(dt > 0, softplus_inverse(dt.clamp_min(torch.finfo(dt.dtype).tiny)), DT_OFF)


def select_tokens(dt_xC: torch.Tensor, thresholds_C: torch.Tensor | None) -> torch.Tensor:
    """LongMamba's token filter (knob "dt_select"): dt where it is above its channel's threshold (the last dim), 0
    elsewhere; dt itself without thresholds (the model as trained, bit for bit). dt > 0, so a threshold of 0 keeps
    every token (a dt that underflowed to 0 stays 0)."""
    if thresholds_C is None:
        return dt_xC
    return torch.where(dt_xC > thresholds_C.to(dt_xC.dtype), dt_xC, 0.0)


def set_token_filter(model: nn.Module, thresholds: list[torch.Tensor | None]) -> None:
    """Set every layer's `dt_select`: a dt threshold per channel (0: the channel keeps every token), or None."""
    if "dt_select" not in knobs(model):
        raise ValueError(f"{type(model).__name__} has no token filter (knob 'dt_select'); it offers "
                         f"{list(knobs(model))}")
    layers = mixers(model)
    if len(thresholds) != len(layers):
        raise ValueError(f"token filter: need one entry per layer ({len(layers)}); got {len(thresholds)}")
    for mixer, thr in zip(layers, thresholds):
        if thr is not None and not bool(((thr >= 0) & torch.isfinite(thr)).all()):
            raise ValueError(f"token filter thresholds must be finite and >= 0; got {thr.tolist()}")
        mixer.dt_select = thr


def _filters(thresholds: torch.Tensor | None) -> bool:
    """A token filter that changes the model (None and all-zero thresholds keep every token)."""
    return thresholds is not None and bool((thresholds > 0).any())


def set_scales(model: nn.Module, knob: str, scales_K: torch.Tensor | None) -> None:
    """Set every layer's `dt_scale`, `A_scale`, `B_scale` or `decay_scale` (scales_K: one value per layer, kept in
    the graph so that a calibration can differentiate through it; None: remove the scales)."""
    if knob not in SCALED or knob not in knobs(model):
        raise ValueError(f"{type(model).__name__} does not scale {knob!r}; it scales {list(knobs(model))}")
    layers = mixers(model)
    if scales_K is not None and scales_K.shape != (len(layers),):
        raise ValueError(f"{knob} scales: need one per layer ({len(layers)}); got shape {tuple(scales_K.shape)}")
    for i, mixer in enumerate(layers):
        setattr(mixer, SCALED[knob], None if scales_K is None else scales_K[i])


@torch.no_grad()
def fold_A_scales(model: nn.Module) -> bool:
    """Move each layer's A scale into its A_log (log_rate: A_log + log s gives A x s exactly); True if the model
    has one."""
    if "A_log" not in knobs(model):
        return False
    for mixer in mixers(model):
        if mixer.A_scale is not None:
            rate = log_rate(mixer)
            rate.add_(torch.log(mixer.A_scale.detach().to(rate)))
            mixer.A_scale = None
    return True


def _set(scale: torch.Tensor | None) -> bool:
    """A scale that changes the model (None and 1 leave it as trained)."""
    return scale is not None and bool((scale.detach() != 1).any())


def prepare_to_write(model: nn.Module) -> None:
    """Before the weights are written (save_pretrained, `recurlen export`): fold each A scale into A_log (exact),
    and refuse, in one line, a scale the written format cannot hold (a dt scale; an A scale without A_log), which
    writing the weights would silently drop."""
    if not knobs(model):
        return
    layers = mixers(model)
    dt = [float(m.dt_scale) if _set(getattr(m, "dt_scale", None)) else 1.0 for m in layers]
    if any(s != 1.0 for s in dt):
        raise UserError(f"{type(model).__name__} has its dt scaled per layer ({', '.join(f'{s:.3g}' for s in dt)}: "
                        "MambaExtend), which no weights file can hold (softplus(x + b) s is no softplus of an affine "
                        "map of x), so writing it would drop the fix; evaluate it where it lives, on the loaded model "
                        "(recurlen eval / passkey / niah fixes=[mambaextend]), or write the model without it")
    for knob, why in (("B", "B comes out of the convolution and its SiLU, so no linear map in the weights holds it"),
                      ("decay", "the log decay dt A + log s is no dt' A of a softplus dt'")):
        if any(_set(getattr(m, SCALED[knob], None)) for m in layers):
            raise UserError(f"{type(model).__name__} has its {knob} scaled (Stuffed Mamba's "
                            f"{'b_mult' if knob == 'B' else 'da_mult'}), which no weights file can hold ({why}), so "
                            "writing it would drop the fix; evaluate it on the loaded model (fixes=[stuffed_mamba]) "
                            "or write the model without it")
    if any(getattr(m, "state_norm_max", None) is not None for m in layers):
        raise UserError(f"{type(model).__name__} has its state norm capped (Stuffed Mamba's state normalisation), "
                        "which no weights format holds, so writing it would drop the fix; evaluate it on the loaded "
                        "model (fixes=[stuffed_mamba]) or write the model without it")
    if any(_filters(getattr(m, "dt_select", None)) for m in layers):
        raise UserError(f"{type(model).__name__} filters tokens in its global channels (LongMamba: dt set to 0 below a "
                        "threshold per channel), which no weights file can hold (a rule per token on dt, not a "
                        "weight), so writing it would drop the fix; evaluate it on the loaded model "
                        "(fixes=[longmamba]) or write the model without it")
    if any(_set(getattr(m, "A_scale", None)) for m in layers):
        if "A_log" not in knobs(model):
            raise UserError(f"{type(model).__name__} has its A scaled per layer (a_scale), which its weights cannot "
                            "hold (A comes from the input, there is no A_log to fold it into), so writing it would "
                            "drop the fix; evaluate it on the loaded model (fixes=[a_scale]) or write the model "
                            "without it")
        fold_A_scales(model)


__all__ = ["DT_OFF", "KNOBS", "SCALED", "fold_A_scales", "kernel_dt", "knobs", "log_rate", "mixers",
           "prepare_to_write", "scaled", "select_tokens", "set_scales", "set_token_filter", "softplus_inverse"]
