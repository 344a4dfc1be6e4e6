"""Stuffed Mamba's training-free knobs (`stuffed_mamba`): global multipliers of dt, of each token's decay, of B and of
A, and a cap on each head's state norm.

Stuffed Mamba (Chen et al., COLM 2025; code thunlp/stuffed-mamba) finds that a model trained on contexts shorter
than its state can hold never learns to forget, so past the training length its state overflows. Its Mamba-2
analysis model (`analysis/modeling/mamba2/modeling_mamba2_torch.py`) has four multipliers, one number each for every
layer and head, which recurlen applies the same way on its Mamba-2:

    dt_mult   dt after its softplus x dt_mult: the decay exp(dt A) and the input dt B x both move    knob "dt"
    da_mult   the log decay dt A + log(da_mult): each token's decay x da_mult                       knob "decay"
    b_mult    B x b_mult: the input to the state alone                                              knob "B"
    a_mult    A x a_mult: the decay alone (folded into A_log afterwards, so a checkpoint keeps it)    knob "A"

Their passkey model (`passkey-retrieval/mamba2/modeling_mamba2.py`) adds a per-head threshold on the state's norm;
here `state_norm` caps each head's state after every token at state_norm x the norm that head's state reaches at the
training length T (the mean over the calibration sequences, measured on the model with the multipliers set and no
cap): h_t <- h_t min(1, cap / ||h_t||). The cap is not linear in the state, so those layers run a token-by-token
scan (Mamba-2's ssd_capped), exact and split-invariant but far slower than the chunked scan (~7-14x on the CPU's tiny
models, one thread; docs/evaluation.md).

What differs from their code: their da_mult is applied in the chunked forward only, not in their one-token step;
here the step has it too, so generation and a forward agree. Their passkey model's cap is applied once per 128 tokens,
on the state after each block (so it depends on where a call starts), and as written multiplies an over-threshold
state by norm / threshold, which grows it; its thresholds are the norms of one calibration sequence's final state, and
no script in the repository calls it. Here the cap is applied per token, scales the state down to the cap, and is
calibrated at T. The passkey model's other knobs (a decay knob of another form, dA_mult / A added to dt; B clipped;
an offset added to A; dt_bias multiplied) are not implemented.

`search` names one setting to choose from `grid` by the calibration loss on held-out sequences of the target length,
the others as given (as `forget_more` chooses its cap); the given value stays where no grid value lowers the loss.
Without `search` the values are applied as given, with no calibration (a state norm cap still measures its norms).
The record's forward passes count the calibration-loss passes over the sequences and the norm passes over their
first T tokens.
On the kernel backend a layer with a decay scale or a cap runs the PyTorch scan (mamba-ssm's scan forms exp(dt A)
from dt and a per-head A and caps nothing); a B, dt or A multiplier keeps the kernel.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from recurlen.evaluation.fixes.base import CalibrationData, Fix, FixRecord, calibration_data, data_record
from recurlen.evaluation.fixes.calibration import calibration_loss
from recurlen.models.timescales import fold_A_scales, mixers, set_scales
from recurlen.util.errors import UserError

MULTIPLIERS = {"dt_mult": "dt", "da_mult": "decay", "b_mult": "B", "a_mult": "A"}
"""Each multiplier and the timescale knob (recurlen.models.timescales) it sets on every layer."""
SEARCHABLE = (*MULTIPLIERS, "state_norm")
DEFAULT_GRIDS: dict[str, list[float]] = {
    "dt_mult": [0.25, 0.5, 0.75, 1.5, 2.0],
    "da_mult": [0.9, 0.99, 0.999, 0.9999, 0.99999],  # an extra forgetting rate of -log(da_mult) per token
    "b_mult": [0.25, 0.5, 0.7, 0.9],
    "a_mult": [0.5, 1.5, 2.0, 4.0, 8.0],
    "state_norm": [0.5, 1.0, 2.0, 4.0],
}


@dataclass
class StuffedMambaConfig(CalibrationData):
    """Stuffed Mamba's multipliers (1: the model as trained) and state norm cap, given or one of them searched."""

    dt_mult: float = 1.0
    """dt after its softplus x dt_mult, every layer and head (moves the decay and the input)."""
    da_mult: float = 1.0
    """Each token's decay exp(dt A) x da_mult (log(da_mult) added to the log decay)."""
    b_mult: float = 1.0
    """B x b_mult (the state's input; the decay stays)."""
    a_mult: float = 1.0
    """A x a_mult (the decay alone; folded into A_log)."""
    state_norm: float | None = None
    """Cap each head's state norm after every token at state_norm x its norm at T (calibration sequences, the mean).
    None: no cap. A token-by-token scan in the capped layers: slow."""
    search: str | None = None
    """One of dt_mult, da_mult, b_mult, a_mult, state_norm, chosen from `grid` by the calibration loss (the others as
    given). None: every value as given, nothing searched."""
    grid: list[float] | None = None
    """Values tried for `search`. None: that setting's default grid (DEFAULT_GRIDS)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in MULTIPLIERS:
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 (1: unchanged); got {getattr(self, name)}")
        if self.state_norm is not None and not self.state_norm > 0:
            raise ValueError(f"state_norm must be > 0 or None; got {self.state_norm}")
        if self.search is not None and self.search not in SEARCHABLE:
            raise ValueError(f"search must be one of {list(SEARCHABLE)} or None; got {self.search!r}")
        if self.grid is not None:
            if self.search is None:
                raise ValueError("grid is tried only for a `search`; set search to one of " + str(list(SEARCHABLE)))
            self.grid = [float(g) for g in self.grid]
            if not self.grid or not min(self.grid) > 0:
                raise ValueError(f"the grid's values must be > 0; got {self.grid}")

    def searched_grid(self) -> list[float]:
        return self.grid if self.grid is not None else list(DEFAULT_GRIDS[self.search])

    def rows_needed(self) -> int:
        return self.sequences if self.search is not None or self.state_norm is not None else 0


def set_multipliers(model: torch.nn.Module, values: dict[str, float]) -> None:
    """Every layer's scale of each knob; a multiplier of 1 is no scale (the model as trained, bit for bit)."""
    layers = len(mixers(model))
    for name, knob in MULTIPLIERS.items():
        set_scales(model, knob, None if values[name] == 1.0 else torch.full((layers,), float(values[name])))


def set_state_norm_caps(model: torch.nn.Module, caps_KH: torch.Tensor | None) -> None:
    """Each layer's cap per head (None: no cap)."""
    for i, mixer in enumerate(mixers(model)):
        mixer.state_norm_max = None if caps_KH is None else caps_KH[i].to(mixer.A_log.device)


@torch.no_grad()
def state_norms_at(model: torch.nn.Module, seqs_NL: torch.Tensor, *, position: int, chunk_len: int) -> torch.Tensor:
    """(K, H): each layer's and head's state norm after the first `position` tokens, the mean over the sequences."""
    state = None
    for start in range(0, position, chunk_len):
        _, state = model(seqs_NL[:, start:min(start + chunk_len, position)], state)
    return torch.linalg.vector_norm(state.ssm.float(), dim=(-2, -1)).mean(dim=1)


class StuffedMamba(Fix):
    name = "stuffed_mamba"
    paper = ("Stuffed Mamba (Chen et al., COLM 2025; thunlp/stuffed-mamba): global multipliers of dt, of each "
             "token's decay, of B and of A, and a cap on each head's state norm")
    needs = ("dt", "A", "B", "decay", "state_norm")
    config_cls = StuffedMambaConfig

    def apply(self, model: torch.nn.Module, cfg: StuffedMambaConfig, *, calibration: torch.Tensor | None,
              train_len: int) -> FixRecord:
        self.check_model(model)
        given = {name: getattr(cfg, name) for name in SEARCHABLE}
        data, passes, norms = None, 0, {}
        if cfg.rows_needed():
            device = next(model.parameters()).device
            data = calibration_data(cfg, calibration, name=self.name).to(device)
            if (cfg.state_norm is not None or cfg.search == "state_norm") and data.shape[1] < train_len:
                raise UserError(f"fix {self.name}: state_norm measures each head's norm at T = {train_len} tokens; "
                                f"the calibration sequences have {data.shape[1]} (set fix.{self.name}.length >= "
                                f"{train_len})")
        started = time.perf_counter()

        def settle(values: dict[str, float | None]) -> None:
            """The model with these values: the multipliers, then the caps measured on it at T (uncapped)."""
            nonlocal passes
            set_multipliers(model, values)
            set_state_norm_caps(model, None)
            if values["state_norm"] is None:
                return
            key = tuple(values[name] for name in MULTIPLIERS)  # the norms depend on the multipliers only
            if key not in norms:
                norms[key] = state_norms_at(model, data, position=train_len, chunk_len=cfg.chunk_len)
                passes += 1
            set_state_norm_caps(model, values["state_norm"] * norms[key])

        def loss() -> float:
            nonlocal passes
            passes += 1
            with torch.no_grad():
                return float(calibration_loss(model, data, chunk_len=cfg.chunk_len, batch_size=cfg.sequences))

        chosen, record = dict(given), None
        if cfg.search is not None:
            settle(given)
            loss_before = loss()
            grid = cfg.searched_grid()
            losses = []
            for value in grid:
                settle({**given, cfg.search: value})
                losses.append(loss())
            best = min(range(len(grid)), key=losses.__getitem__)
            if losses[best] < loss_before:  # else no grid value helps: the given value stays
                chosen[cfg.search] = grid[best]
            record = {"method": "grid", "steps": len(grid), "searched": cfg.search, "grid": grid,
                      "data": data_record(data),
                      "loss_before": loss_before, "loss_after": min(loss_before, losses[best]), "losses": losses}
        settle(chosen)
        caps = [m.state_norm_max for m in mixers(model)]
        if chosen["state_norm"] is not None and record is None:
            record = {"method": "state norms at T", "steps": 0, "position": train_len,
                      "data": data_record(data, length=train_len),
                      "loss_before": None, "loss_after": None, "losses": []}
        if record is not None:
            record.update(forward_passes=passes, seconds=time.perf_counter() - started)
        folded = chosen["a_mult"] != 1.0 and fold_A_scales(model)
        capped = chosen["state_norm"] is not None
        # the searched value, and each measured cap (numbers taken from the calibration data)
        numbers = int(cfg.search is not None) + (sum(c.numel() for c in caps) if capped else 0)
        return FixRecord(self.name, self.paper, config=vars(cfg).copy(), calibrated_parameters=numbers,
                         values={"multipliers": {name: chosen[name] for name in MULTIPLIERS},
                                 "state_norm": chosen["state_norm"],
                                 "state_norm_caps": [[float(v) for v in c] for c in caps] if capped else None,
                                 "folded_into": "A_log" if folded else None},
                         calibration=record)


__all__ = ["DEFAULT_GRIDS", "MULTIPLIERS", "StuffedMamba", "StuffedMambaConfig", "set_multipliers",
           "set_state_norm_caps", "state_norms_at"]
