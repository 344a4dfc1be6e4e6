"""recurlen's memory cap (`forget_more`): every state entry's memory at zero input bounded by `memory` x T.

The design is recurlen's own; the motivation is Stuffed Mamba's (Chen et al., COLM 2025; thunlp/stuffed-mamba): a
model trained on contexts shorter than its state can hold never learns to forget, so past the training length its
state overflows ("state collapse"), and making the model forget more brings the loss back. What Stuffed Mamba's code
has for that is different: global multipliers, one number for every layer, of dt, of the per-token decay, of B and of
A (set_dt_mult, set_da_mult, set_b_mult, set_a_mult in its Mamba-2 analysis model), applied by recurlen's fix
`stuffed_mamba`. recurlen's cap: every state entry whose memory at zero input, 1 / (dt(0) |A|) tokens, is longer than
`memory` x T (T the training context) gets its A scaled so that it is exactly that; faster entries are untouched. The
change is folded into A_log (the mixer's log-rate parameter, recurlen.models.timescales.log_rate: RWKV-6's
time_decay), so checkpoints and exports keep it. `memory` is chosen from a grid by the calibration
loss on held-out sequences of the target length (one number calibrated), or given.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from recurlen.evaluation.fixes.base import CalibrationData, Fix, FixRecord, calibration_data, data_record
from recurlen.evaluation.fixes.calibration import calibration_loss
from recurlen.models.timescales import log_rate, mixers


@dataclass
class ForgetMoreConfig(CalibrationData):
    """The memory cap, given or chosen from a grid on held-out sequences of the target length."""

    memory: float | None = None
    """Longest memory a state entry keeps, in units of the training context T. None: the grid's best."""
    grid: list[float] = field(default_factory=lambda: [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0])
    """Caps tried when memory is None."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.grid = [float(g) for g in self.grid]
        if (self.memory is not None and self.memory <= 0) or not self.grid or min(self.grid) <= 0:
            raise ValueError(f"memory and the grid's values must be > 0; got {self.memory}, {self.grid}")

    def rows_needed(self) -> int:
        return 0 if self.memory is not None else self.sequences


def entry_rates(mixer: torch.nn.Module) -> torch.Tensor:
    """Each A_log entry's decay rate per token at zero input (decay_rates() is the log-rate parameter's shape, then
    the dims its entries share)."""
    return mixer.decay_rates().reshape(*log_rate(mixer).shape, -1)[..., 0].float()


@torch.no_grad()
def cap_memory(model: torch.nn.Module, originals: list[torch.Tensor], memory_tokens: float) -> int:
    """A_log from `originals`, with every entry slower than 1 / memory_tokens sped up to it; entries changed."""
    changed = 0
    for mixer, a_log in zip(mixers(model), originals):
        rate = log_rate(mixer)
        rate.copy_(a_log)
        factor = (1.0 / memory_tokens / entry_rates(mixer).clamp_min(1e-30)).clamp_min(1.0)
        rate.add_(torch.log(factor).to(rate))
        changed += int((factor > 1.0).sum())
    return changed


class ForgetMore(Fix):
    name = "forget_more"
    paper = ("recurlen's own cap on the slow entries' memory, motivated by Stuffed Mamba (Chen et al., COLM 2025; "
             "thunlp/stuffed-mamba): models trained short never learn to forget")
    needs = ("A_log",)
    config_cls = ForgetMoreConfig

    def apply(self, model: torch.nn.Module, cfg: ForgetMoreConfig, *, calibration: torch.Tensor | None,
              train_len: int) -> FixRecord:
        self.check_model(model)
        originals = [log_rate(m).detach().clone() for m in mixers(model)]
        record, memory = None, cfg.memory
        if memory is None:
            started = time.perf_counter()
            device = next(model.parameters()).device
            data = calibration_data(cfg, calibration, name=self.name).to(device)
            with torch.no_grad():
                loss_before = float(calibration_loss(model, data, chunk_len=cfg.chunk_len, batch_size=cfg.sequences))
                losses = {}
                for m in cfg.grid:
                    cap_memory(model, originals, m * train_len)
                    losses[m] = float(calibration_loss(model, data, chunk_len=cfg.chunk_len,
                                                       batch_size=cfg.sequences))
            memory = min(losses, key=losses.get)
            if losses[memory] >= loss_before:  # no cap helps: the model as trained
                memory = math.inf
            record = {"method": "grid", "steps": len(cfg.grid), "grid": cfg.grid,
                      "data": data_record(data),
                      "loss_before": loss_before, "loss_after": min(loss_before, losses[min(losses, key=losses.get)]),
                      "losses": [losses[m] for m in cfg.grid], "forward_passes": len(cfg.grid) + 1,
                      "seconds": time.perf_counter() - started}
        changed = cap_memory(model, originals, memory * train_len)
        return FixRecord(self.name, self.paper, config=vars(cfg).copy(), calibrated_parameters=1 if record else 0,
                         values={"memory_T": None if math.isinf(memory) else memory, "entries_changed": changed,
                                 "entries": sum(a.numel() for a in originals), "folded_into": "A_log"},
                         calibration=record)


__all__ = ["ForgetMore", "ForgetMoreConfig", "cap_memory", "entry_rates"]
