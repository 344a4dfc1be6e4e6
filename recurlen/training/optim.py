"""AdamW with mamba-ssm's no-decay set, and a warmup + cosine / constant / linear schedule."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

SCHEDULES = ("cosine", "constant", "linear")


@dataclass
class OptimConfig:
    lr: float = 1e-4
    """Peak learning rate (used as is unless lr_from_pretrain applies)."""
    lr_from_pretrain: float | None = None
    """When set and the model preset records its pre-training peak rate (model.pretrain_lr), the peak rate is
    model.pretrain_lr x this factor (the paper: ~1/10), unless optim.lr is given on the command line."""
    weight_decay: float = 0.1
    """Decoupled weight decay on matrices; norms, biases, A_log, dt_bias and D are never decayed."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    """AdamW (beta1, beta2)."""
    eps: float = 1e-8
    """AdamW epsilon."""
    warmup_steps: int = 50
    """Linear warmup from 0 (optimizer steps)."""
    schedule: str = "cosine"
    """After warmup: cosine to min_lr_ratio*lr, linear to min_lr_ratio*lr, or constant."""
    min_lr_ratio: float = 0.1
    """The rate the schedule ends at, as a fraction of lr."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (0 disables clipping)."""

    def __post_init__(self) -> None:
        if self.lr_from_pretrain is not None and not 0 < self.lr_from_pretrain <= 1:
            raise ValueError(f"optim.lr_from_pretrain must be in (0, 1] or null; got {self.lr_from_pretrain}")
        if not (math.isfinite(self.lr) and self.lr > 0):  # `not >` refuses nan too; inf needs isfinite
            raise ValueError(f"optim.lr must be a finite number > 0; got {self.lr}")
        if self.weight_decay < 0:
            raise ValueError(f"optim.weight_decay must be >= 0; got {self.weight_decay}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"optim.betas must be two numbers in [0, 1); got {list(self.betas)}")
        if self.warmup_steps < 0:
            raise ValueError(f"optim.warmup_steps must be >= 0; got {self.warmup_steps}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"optim.schedule={self.schedule!r} is unknown; allowed: {list(SCHEDULES)}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"optim.min_lr_ratio must be in [0, 1]; got {self.min_lr_ratio}")
        if self.grad_clip < 0:
            raise ValueError(f"optim.grad_clip must be >= 0; got {self.grad_clip}")


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    decay, no_decay, seen = [], [], set()
    for _, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:  # tied weights appear twice
            continue
        seen.add(id(p))
        (no_decay if p.dim() < 2 or getattr(p, "_no_weight_decay", False) else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def lr_multiplier(step: int, *, cfg: OptimConfig, total_steps: int) -> float:
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return 1.0
    span = max(1, total_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    if cfg.schedule == "linear":
        shape = 1.0 - progress
    else:
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * shape


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig, *, total_steps: int):
    opt = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_multiplier(s, cfg=cfg, total_steps=total_steps))
    return opt, sched
