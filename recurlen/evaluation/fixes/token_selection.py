"""LongMamba's token selection (`longmamba`): past the training length, the global channels take in only the tokens
whose dt is above a threshold; every other token leaves their state as it was.

LongMamba (Ye et al., ICLR 2025, arXiv 2504.16053; code GATECH-EIC/LongMamba, read at commit 5da3e17) splits a
Mamba's channels by receptive field. A channel whose state keeps more than c = 0.05 of itself over a whole sequence of
the training length T (its decay exp(A sum_t dt_t) over T tokens) is global: it would carry information past T.
Past T such a channel decays more than it ever did in training, so LongMamba filters its tokens: each global channel
gets a threshold on dt, a token whose dt is not above it has dt set to 0 in that channel (decay exp(0) = 1, input
0 B x = 0: the state passes unchanged), and the threshold is aligned so that the tokens kept in a sequence of the
target length L add up to the dt the channel sums over T tokens (the "align target"). Its calibration
(load_align_target.py), per sequence of T tokens from a zero state: clamp each channel's dt at its k-th largest
value (k = clamp_top x T), sum it over the sequence (the align target), take exp(A sum) as the channel's decay,
stretch the channel's sorted dt linearly to L points, find the first rank at which their running sum exceeds the
align target, and take the value one rank further as the threshold; then average (or take the maximum of) decays
and thresholds over the sequences. A channel is global when the averaged decay is above c; its threshold is
multiplied by b = 1 (`scale`).

What recurlen does differently, and why:
- The model is a stream with a carried state: every token, in every chunk and in the one-token step, is filtered
  with the thresholds of one target length L (`target_len`, the calibration length by default). LongMamba picks,
  per prompt, the thresholds of the length on its grid (1k ... 192k) nearest to the prompt's length, filters only
  prompts of 3,000 tokens or more, and only the prompt: the decoding steps run unfiltered. Here the thresholds are
  computed for L itself (the stretch works for any length), and L <= T filters nothing (LongMamba's thresholds are
  0 at 1k and 2k, its training length).
- The calibration windows are the held-out sequences (CalibrationData, never the ones scored) cut into windows of T
  tokens, each run from a zero state in one forward call; LongMamba reads 100 sequences of 2,000 tokens (4,000 for
  Zamba2) from a text file of The Pile. `chunk_len` is only the loss passes'.
- LongMamba's script computes align targets for clamp fractions 0.10, 0.15 and 0.20, both averaged and maximal,
  and its evaluation reads a released folder ("longmamba") whose settings its code does not say; recurlen's defaults
  are clamp_top 0.1 and the average, and both are settings.
- LongMamba's released code implements Mamba-2 only (its Mamba-1 numbers come from code it did not release). On
  Mamba-1, dt is per inner channel but A has d_state entries per channel: recurlen takes a channel's decay at its
  slowest entry (min_n |A|), the one that reaches furthest, to decide whether it is global.
- The calibration also measures the next-token loss on the held-out sequences before and after (two more passes),
  for the record; nothing is chosen by it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from recurlen.evaluation.fixes.base import CalibrationData, Fix, FixRecord, calibration_data, data_record
from recurlen.evaluation.fixes.calibration import calibration_loss
from recurlen.models.timescales import mixers, set_token_filter
from recurlen.util.errors import UserError

BLOCK = 1 << 22
"""Most stretched dt values held at once (channels x target_len, float64): 32 MiB, whatever the target length."""


@dataclass
class LongMambaConfig(CalibrationData):
    """LongMamba's settings (its names in brackets), calibrated on held-out sequences cut into training-length
    windows."""

    channel_threshold: float = 0.05
    """A channel is global when its decay over T tokens, exp(A sum dt), is above this [c, 5e-2]. 1: no channel is
    (the model as trained)."""
    clamp_top: float = 0.1
    """Each channel's largest dt (this fraction of a window's tokens) are clamped to the smallest of them before the
    align target is summed [the clamp ratio: 0.10, 0.15 or 0.20 in its script]. 0: no clamp."""
    aggregate: str = "avg"
    """How the windows' decays and thresholds are combined: avg or max [its align folders -avg and -max]."""
    scale: float = 1.0
    """Every threshold multiplied by this [b, 1]. 0: no token is filtered."""
    target_len: int | None = None
    """The sequence length the thresholds are aligned to. None: the calibration length (`length`, else the
    evaluation's seq_len)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.channel_threshold <= 1.0:
            raise ValueError(f"channel_threshold must be in [0, 1]; got {self.channel_threshold}")
        if not 0.0 <= self.clamp_top < 1.0:
            raise ValueError(f"clamp_top must be in [0, 1); got {self.clamp_top}")
        if self.aggregate not in ("avg", "max"):
            raise ValueError(f"aggregate must be avg or max; got {self.aggregate!r}")
        if not 0.0 <= self.scale < math.inf:
            raise ValueError(f"scale must be a finite number >= 0; got {self.scale}")
        if self.target_len is not None and self.target_len < 2:
            raise ValueError(f"target_len must be >= 2 tokens or None; got {self.target_len}")


def align_targets(dt_TC: torch.Tensor, rate_C: torch.Tensor, *, target_len: int,
                  clamp_top: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One window's (decay (C,), threshold (C,)) per channel from its dt (T, C), LongMamba's recipe: dt clamped at
    its k-th largest value per channel, decay exp(-rate sum dt), threshold the value one rank past where the sorted
    dt, stretched to target_len points, first sums to more than the window's sum (0 when target_len <= T)."""
    dt_CT = dt_TC.double().t()
    window = dt_CT.shape[1]
    if clamp_top > 0:
        k = max(1, int(window * clamp_top))
        dt_CT = torch.minimum(dt_CT, dt_CT.topk(k, dim=-1).values.amin(dim=-1, keepdim=True))
    total_C = dt_CT.sum(-1)
    decay_C = torch.exp(-rate_C.double() * total_C)
    if target_len <= window:
        return decay_C, torch.zeros_like(decay_C)
    ranked_CT = dt_CT.sort(dim=-1, descending=True).values
    threshold_C = torch.empty_like(total_C)
    step = max(1, BLOCK // target_len)
    for a in range(0, ranked_CT.shape[0], step):  # a block of channels at a time: memory independent of target_len
        stretched_cL = F.interpolate(ranked_CT[a:a + step, None], size=target_len, mode="linear",
                                     align_corners=False)[:, 0]
        first_c = (stretched_cL.cumsum(-1) > total_C[a:a + step, None]).int().argmax(-1)
        rank_c = (first_c + 1).clamp(max=target_len - 1)
        threshold_C[a:a + step] = stretched_cL.gather(-1, rank_c[:, None])[:, 0]
    return decay_C, threshold_C


@torch.no_grad()
def window_targets(model: torch.nn.Module, windows_WT: torch.Tensor, *, batch_size: int, target_len: int,
                   clamp_top: float) -> tuple[list[torch.Tensor], list[torch.Tensor], int]:
    """Every layer's (decays (W, C), thresholds (W, C)) over the windows, each run from a zero state in one call; and
    the forward calls made. dt is read where the mixer forms it (its dt_probe), before any token filter."""
    layers = mixers(model)
    decays: list[list[torch.Tensor]] = [[] for _ in layers]
    thresholds: list[list[torch.Tensor]] = [[] for _ in layers]

    def recorder(i: int, dt_of, rate_C: torch.Tensor):
        def hook(_module, _inputs, out):
            for dt_TC in dt_of(out).float():  # one window at a time
                decay_C, threshold_C = align_targets(dt_TC, rate_C, target_len=target_len, clamp_top=clamp_top)
                decays[i].append(decay_C)
                thresholds[i].append(threshold_C)
        return hook

    handles = []
    for i, mixer in enumerate(layers):
        module, dt_of, rate_C = mixer.dt_probe()
        handles.append(module.register_forward_hook(recorder(i, dt_of, rate_C.detach())))
    calls = 0
    try:
        for lo in range(0, windows_WT.shape[0], batch_size):
            model(windows_WT[lo:lo + batch_size])
            calls += 1
    finally:
        for h in handles:
            h.remove()
    return [torch.stack(d) for d in decays], [torch.stack(t) for t in thresholds], calls


class LongMamba(Fix):
    name = "longmamba"
    paper = ("LongMamba (Ye et al., ICLR 2025; GATECH-EIC/LongMamba): past the training length the global channels "
             "take in only the tokens whose dt is above a threshold aligned to the training length")
    needs = ("dt_select",)
    config_cls = LongMambaConfig

    def apply(self, model: torch.nn.Module, cfg: LongMambaConfig, *, calibration: torch.Tensor | None,
              train_len: int) -> FixRecord:
        self.check_model(model)
        started = time.perf_counter()
        layers = mixers(model)
        set_token_filter(model, [None] * len(layers))  # calibrate on the model's own dt
        device = next(model.parameters()).device
        data = calibration_data(cfg, calibration, name=self.name).to(device)
        target_len = cfg.target_len or int(data.shape[1])
        per_sequence = data.shape[1] // train_len
        if per_sequence < 1:
            raise UserError(f"fix {self.name}: its windows are the training length ({train_len} tokens), longer "
                             f"than the calibration sequences ({data.shape[1]}); set fix.{self.name}.length >= "
                             f"{train_len}")
        windows_WT = data[:, :per_sequence * train_len].reshape(-1, train_len)
        decays, thresholds, calls = window_targets(model, windows_WT, batch_size=cfg.sequences,
                                                   target_len=target_len, clamp_top=cfg.clamp_top)
        combine = (lambda t: t.mean(0)) if cfg.aggregate == "avg" else (lambda t: t.amax(0))
        global_ = [combine(d) > cfg.channel_threshold for d in decays]
        chosen = [torch.where(g, combine(t) * cfg.scale, 0.0).float() for g, t in zip(global_, thresholds)]
        filters = [thr if bool((thr > 0).any()) else None for thr in chosen]
        with torch.no_grad():
            loss_before = float(calibration_loss(model, data, chunk_len=cfg.chunk_len, batch_size=cfg.sequences))
            set_token_filter(model, [None if f is None else f.to(device) for f in filters])
            loss_after = float(calibration_loss(model, data, chunk_len=cfg.chunk_len, batch_size=cfg.sequences))
        record = {"method": "align targets", "windows": int(windows_WT.shape[0]), "window_len": train_len,
                  "target_len": target_len, "aggregate": cfg.aggregate,
                  "data": data_record(data),
                  "loss_before": loss_before, "loss_after": loss_after, "forward_calls": calls,
                  "forward_passes": 3,  # over the calibration tokens: once as windows, twice for the loss
                  "seconds": time.perf_counter() - started}
        set_thresholds = [thr[thr > 0] for thr in chosen]
        values = {"target_len": target_len, "train_len": train_len, "filtered": any(f is not None for f in filters),
                  "global_channels": [int(g.sum()) for g in global_], "channels": [int(g.numel()) for g in global_],
                  "thresholds": [None if not len(t) else {"min": float(t.min()), "median": float(t.median()),
                                                         "max": float(t.max())} for t in set_thresholds]}
        return FixRecord(self.name, self.paper, config=vars(cfg).copy(),
                         calibrated_parameters=sum(len(t) for t in set_thresholds), values=values, calibration=record)


__all__ = ["LongMamba", "LongMambaConfig", "align_targets", "window_targets"]
