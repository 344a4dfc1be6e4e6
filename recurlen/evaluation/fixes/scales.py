"""Per-layer scales of the timescales, calibrated at the target length: MambaExtend (dt) and spectrum scaling (A).

MambaExtend (Azizi et al., ICLR 2025; code ArminAzizi98/LongContextMamba) multiplies each layer's discretisation
step dt = softplus(.) by a scalar s_l and calibrates the scales on a few sequences of the target length, every
weight frozen. Since dt enters both the decay exp(dt A) and the input dt B x, a scale moves both; on Mamba-3 dt also
drives the rotation of B and C (the angle advances by pi tanh(.) dt per token, recurlen.models.mamba3.scan), so a dt
scale speeds the rotation as well. Spectrum scaling ("Mamba Modulation", Lu et al., arXiv 2509.19633) scales each
layer's A instead, which moves the decay (the spectrum of the transition) alone, on Mamba-3 too, and is calibrated
the same way here.

What differs from MambaExtend's code (its perplexity_eval/eval.py; docs/evaluation.md has the table): the scales
start at 1 (the model as trained; MambaExtend starts from random values in [0.75, 1]) and are searched in log space,
bounded to [0.01, 100] (MambaExtend: the scales themselves, a floor of 0.01); the loss is recurlen's calibration NLL
(nats) rather than perplexity; the defaults are 4 calibration sequences and 20 SPSA steps of 0.5 in log-scale units
decaying to ~0 (MambaExtend: 20 sequences, 50 iterations, a step of 1e-3 on perplexity whose cosine ends at 0.71 of
its start); and an A scale is folded into A_log after calibration (A_log + log s), so a saved or exported model
keeps it. A dt scale has no exact place in the weights (softplus(x + b) s is no softplus of an affine map of x): it
stays on the loaded model (recurlen.models.timescales), which the evaluation and tasks use; writing such a model's
weights (save_pretrained, `recurlen export`) is refused in one line instead of dropping the scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from recurlen.evaluation.fixes.base import CalibrationConfig, Fix, FixRecord, calibration_data, data_record
from recurlen.evaluation.fixes.calibration import calibration_loss, gradient_descent, spsa
from recurlen.models.timescales import fold_A_scales, mixers, set_scales


@dataclass
class LayerScaleConfig(CalibrationConfig):
    """A scale per layer, calibrated (SPSA by default) on held-out sequences of the target length."""

    init: float = 1.0
    """Every layer's scale before calibration (1: the model as trained)."""
    lr: float | None = None
    """Step size in log-scale units. None: 0.5 for spsa (a loss difference of 0.1 nats over a +-10% perturbation
    moves a scale by ~25%), 0.05 for backprop (Adam)."""
    perturb: float = 0.1
    """SPSA's first perturbation, relative (c_0 = 0.1 as in MambaExtend), decaying as c_0 / (1 + k)^0.1."""
    min_scale: float = 0.01
    """Smallest scale (MambaExtend's floor)."""
    max_scale: float = 100.0
    """Largest scale."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.min_scale <= self.init <= self.max_scale:
            raise ValueError(f"need 0 < min_scale <= init <= max_scale; got {self.min_scale}, {self.init}, "
                             f"{self.max_scale}")
        if self.perturb <= 0 or (self.lr is not None and self.lr <= 0):
            raise ValueError(f"perturb and lr must be > 0; got {self.perturb}, {self.lr}")


class LayerScaleFix(Fix):
    knob: ClassVar[str]
    config_cls = LayerScaleConfig

    def apply(self, model: torch.nn.Module, cfg: LayerScaleConfig, *, calibration: torch.Tensor | None,
              train_len: int) -> FixRecord:
        self.check_model(model)
        device = next(model.parameters()).device
        layers = len(mixers(model))
        theta0 = torch.full((layers,), math.log(cfg.init))
        bounds = (math.log(cfg.min_scale), math.log(cfg.max_scale))

        def put(theta: torch.Tensor) -> None:
            set_scales(model, self.knob, theta.to(device).exp())

        record = None
        theta = theta0
        if cfg.steps > 0:
            data = calibration_data(cfg, calibration, name=self.name).to(device)

            def loss(theta: torch.Tensor) -> torch.Tensor:
                put(theta)
                return calibration_loss(model, data, chunk_len=cfg.chunk_len, batch_size=cfg.sequences)

            frozen = [p for p in model.parameters() if p.requires_grad]
            for p in frozen:  # only the scales are calibrated: no gradient buffers for the weights
                p.requires_grad_(False)
            try:
                if cfg.method == "spsa":
                    with torch.no_grad():
                        theta, trace = spsa(lambda t: float(loss(t)), theta0, steps=cfg.steps,
                                            lr=cfg.lr or 0.5, perturb=cfg.perturb, seed=cfg.seed, bounds=bounds)
                else:
                    theta, trace = gradient_descent(loss, theta0, steps=cfg.steps, lr=cfg.lr or 0.05, bounds=bounds)
            finally:
                for p in frozen:
                    p.requires_grad_(True)
            record = {"method": cfg.method, "steps": cfg.steps, "seed": cfg.seed,
                      "data": data_record(data), **trace.to_dict()}
        with torch.no_grad():
            put(theta)
        scales = [float(s) for s in theta.exp()]
        folded = self.knob == "A" and fold_A_scales(model)
        return FixRecord(self.name, self.paper, config=vars(cfg).copy(), calibrated_parameters=layers,
                         values={"scales": scales, "folded_into": "A_log" if folded else None},
                         calibration=record)


class MambaExtend(LayerScaleFix):
    name = "mambaextend"
    paper = "MambaExtend (Azizi et al., ICLR 2025; ArminAzizi98/LongContextMamba): a scale of dt per layer"
    needs = ("dt",)
    knob = "dt"


class AScale(LayerScaleFix):
    name = "a_scale"
    paper = "Mamba Modulation (Lu et al., arXiv 2509.19633): a scale of A (the transition's spectrum) per layer"
    needs = ("A",)
    knob = "A"


__all__ = ["AScale", "LayerScaleConfig", "LayerScaleFix", "MambaExtend"]
