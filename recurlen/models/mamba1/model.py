"""Mamba-1 language model with a carried recurrent state.

    logits, state = model(input_ids, state)        # state in, final state out

Parameter names and shapes are those of the official state-spaces/mamba-* checkpoints:
    backbone.embedding.weight                       (V_pad, D)
    backbone.layers.{i}.norm.weight                 (D,)
    backbone.layers.{i}.mixer.in_proj.weight        (2*d_inner, D)             -> [x | z]
    backbone.layers.{i}.mixer.conv1d.{weight,bias}  (d_inner, 1, d_conv), (d_inner,)
    backbone.layers.{i}.mixer.x_proj.weight         (dt_rank + 2*N, d_inner)   -> [dt | B | C]
    backbone.layers.{i}.mixer.dt_proj.{weight,bias} (d_inner, dt_rank), (d_inner,)
    backbone.layers.{i}.mixer.A_log                 (d_inner, N)
    backbone.layers.{i}.mixer.D                     (d_inner,)
    backbone.layers.{i}.mixer.out_proj.weight       (D, d_inner)
    backbone.norm_f.weight                          (D,)
    lm_head.weight                                  (V_pad, D), tied to the embedding

Legend: B batch, L length, D d_model, I d_inner, N d_state, R dt_rank, W = d_conv - 1, K layers.
"""

from __future__ import annotations

import functools
import logging

import torch
import torch.nn as nn
import torch.nn.functional as F

from recurlen.models.causal_conv import causal_conv, causal_conv_kernel
from recurlen.models.layers import sample_A, sample_dt_bias, up
from recurlen.models.mamba1 import kernels
from recurlen.models.mamba1.config import Mamba1Config
from recurlen.models.mamba1.kernels import KERNELS
from recurlen.models.mamba1.scan import selective_scan_chunked, selective_scan_step
from recurlen.models.mamba1.state import Mamba1State
from recurlen.models.mamba1.transformers_format import TRANSFORMERS_FORMAT
from recurlen.models.mixer_model import MixerModelLM
from recurlen.models.timescales import kernel_dt, scaled, select_tokens

log = logging.getLogger(__name__)


@functools.cache
def _warn_packed_on_torch_scan() -> None:
    log.warning("Mamba-1 with documents packed in a row: mamba-ssm's selective_scan_fn cannot reset the state inside "
                "a row, so these rows run the PyTorch scan (exact, slower); data.layout=documents keeps the kernel")


class Mamba1Mixer(nn.Module):
    def __init__(self, cfg: Mamba1Config) -> None:
        super().__init__()
        self.cfg = cfg
        d_inner = cfg.d_inner
        self.in_proj = nn.Linear(cfg.d_model, 2 * d_inner, bias=cfg.bias)
        self.conv1d = nn.Conv1d(d_inner, d_inner, cfg.d_conv, groups=d_inner, padding=cfg.d_conv - 1,
                                bias=cfg.conv_bias)
        self.x_proj = nn.Linear(d_inner, cfg.dt_rank + 2 * cfg.d_state, bias=False)
        self.dt_proj = nn.Linear(cfg.dt_rank, d_inner, bias=True)
        self.A_log = nn.Parameter(torch.empty(d_inner, cfg.d_state))
        self.D = nn.Parameter(torch.ones(d_inner))
        self.out_proj = nn.Linear(d_inner, cfg.d_model, bias=cfg.bias)
        for p in (self.A_log, self.D):
            p._no_weight_decay = True
        # Scales of dt and A per layer set by training-free fixes (recurlen.models.timescales); None: as trained.
        self.dt_scale: torch.Tensor | None = None
        self.A_scale: torch.Tensor | None = None
        # LongMamba's token filter (timescales, knob "dt_select"): a dt threshold per inner channel (I,), 0 where the
        # channel keeps every token; None: as trained.
        self.dt_select: torch.Tensor | None = None
        self.reset_ssm_parameters()

    @torch.no_grad()
    def reset_ssm_parameters(self) -> None:
        """mamba-ssm's Mamba-1 initialisation of dt_proj, A_log (S4D-real: A = -(1..N), or A_init_range) and D."""
        cfg = self.cfg
        std = cfg.dt_rank**-0.5 * cfg.dt_scale
        nn.init.uniform_(self.dt_proj.weight, -std, std)
        self.dt_proj.bias.copy_(sample_dt_bias(cfg.d_inner, dt_min=cfg.dt_min, dt_max=cfg.dt_max,
                                               floor=cfg.dt_init_floor))
        if cfg.A_init_range is None:
            self.A_log.copy_(torch.log(torch.arange(1, cfg.d_state + 1, dtype=torch.float32)).repeat(cfg.d_inner, 1))
        else:
            A = sample_A((cfg.d_inner, cfg.d_state), cfg.A_init_range, log_uniform=cfg.A_init_log_uniform)
            self.A_log.copy_(torch.log(A))
        self.D.fill_(1.0)

    def _ssm_inputs(self, x_BLI: torch.Tensor):
        """x -> (dt after softplus and the token filter, B, C) through x_proj and dt_proj."""
        cfg = self.cfg
        dt_BLR, B_BLN, C_BLN = torch.split(self.x_proj(x_BLI), [cfg.dt_rank, cfg.d_state, cfg.d_state], dim=-1)
        return select_tokens(self._dt(dt_BLR), self.dt_select), B_BLN, C_BLN

    def _dt(self, dt_BLR: torch.Tensor) -> torch.Tensor:
        # softplus(W dt + bias): the bias is dt_proj's, as in the kernel's delta_bias.
        return scaled(F.softplus(up(self.dt_proj(dt_BLR))), self.dt_scale)

    def _A(self) -> torch.Tensor:
        return scaled(-torch.exp(up(self.A_log)), self.A_scale)

    def forward(self, u_BLD: torch.Tensor, ssm_state_BIN: torch.Tensor, conv_state_BIW: torch.Tensor, *,
                use_kernels: bool,
                resets: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        if use_kernels and resets is not None:
            # selective_scan_fn has no reset: packed rows take the PyTorch scan (and conv), exact but slower.
            _warn_packed_on_torch_scan()
            use_kernels = False
        x_BLI, z_BLI = self.in_proj(u_BLD).chunk(2, dim=-1)
        conv_weight_IK = self.conv1d.weight.squeeze(1)
        conv_out = causal_conv_kernel(x_BLI, conv_weight_IK, self.conv1d.bias, conv_state_BIW) if use_kernels else None
        if conv_out is None:
            x_BLI, conv_state_BIW = causal_conv(x_BLI, conv_weight_IK, self.conv1d.bias, conv_state_BIW,
                                                resets_BL=resets)
            x_BLI = F.silu(x_BLI)
        else:
            x_BLI, conv_state_BIW = conv_out
        A_IN = self._A()
        if use_kernels:
            dt_BLR, B_BLN, C_BLN = torch.split(self.x_proj(x_BLI), [cfg.dt_rank, cfg.d_state, cfg.d_state], dim=-1)
            dt_raw_BLI, dt_bias_I = F.linear(dt_BLR, self.dt_proj.weight), self.dt_proj.bias
            if self.dt_scale is not None or self.dt_select is not None:
                # the kernel forms softplus(dt + bias): give it the preimage of the scaled, filtered dt
                dt_BLI = select_tokens(scaled(F.softplus(up(dt_raw_BLI + dt_bias_I)), self.dt_scale), self.dt_select)
                dt_raw_BLI, dt_bias_I = kernel_dt(dt_BLI), torch.zeros_like(dt_bias_I)
            y_BLI, ssm_state_BIN = kernels.selective_scan(
                x_BLI, dt_raw_BLI, A_IN, B_BLN, C_BLN, D_I=self.D, dt_bias_I=dt_bias_I,
                initial_state_BIN=ssm_state_BIN)
        else:
            dt_BLI, B_BLN, C_BLN = self._ssm_inputs(x_BLI)
            y_BLI, ssm_state_BIN = selective_scan_chunked(x_BLI, dt_BLI, A_IN, B_BLN, C_BLN, chunk_size=cfg.chunk_size,
                                                          initial_state_BDN=ssm_state_BIN, resets_BL=resets)
            y_BLI = torch.addcmul(y_BLI, up(x_BLI), up(self.D))
        y_BLI = (y_BLI * F.silu(up(z_BLI))).to(u_BLD.dtype)
        return self.out_proj(y_BLI), ssm_state_BIN, up(conv_state_BIW)

    def step(self, u_BD: torch.Tensor, ssm_state_BIN: torch.Tensor, conv_state_BIW: torch.Tensor):
        """One token: the same math as forward with L = 1, without the chunk machinery."""
        x_BI, z_BI = self.in_proj(u_BD).chunk(2, dim=-1)
        x_B1I, conv_state_BIW = causal_conv(x_BI.unsqueeze(1), self.conv1d.weight.squeeze(1), self.conv1d.bias,
                                            conv_state_BIW)
        x_BI = F.silu(x_B1I.squeeze(1))
        dt_BI, B_BN, C_BN = self._ssm_inputs(x_BI)
        y_BI, ssm_state_BIN = selective_scan_step(x_BI, dt_BI, self._A(), B_BN, C_BN,
                                                  up(ssm_state_BIN))
        y_BI = (y_BI + up(x_BI) * up(self.D)) * F.silu(up(z_BI))
        return self.out_proj(y_BI.to(u_BD.dtype)), ssm_state_BIN, up(conv_state_BIW)

    def decay_rates(self) -> torch.Tensor:
        """(d_inner, N): each state entry's decay rate per token at zero input, softplus(dt bias) x |A| (the
        entry keeps exp(-rate) of itself per token; the input moves dt, per channel, around this)."""
        return scaled(F.softplus(up(self.dt_proj.bias)), self.dt_scale)[:, None] * -self._A()

    def dt_probe(self):
        """What the token filter's calibration reads (timescales, knob "dt_select"): the submodule whose output holds
        the raw dt (x_proj: [dt | B | C]), the map from that output to dt per channel (B, L, I) before the filter,
        and each channel's slowest decay per unit dt, min_n |A[i, n]| (I,): the entry that reaches furthest."""
        return self.x_proj, lambda out: self._dt(out[..., :self.cfg.dt_rank]), (-self._A()).amin(dim=-1)


class Mamba1LM(MixerModelLM):
    """Mamba-1 LM: embedding -> blocks -> norm_f -> (tied) LM head, with state in and out (the shell is
    StatefulLM's, the layout mamba-ssm's: recurlen.models.mixer_model)."""

    config_cls = Mamba1Config
    state_cls = Mamba1State
    kernels = KERNELS
    mixer_cls = Mamba1Mixer
    transformers = TRANSFORMERS_FORMAT
    supports_resets = True
    TIMESCALES = ("dt", "A", "A_log", "dt_select")  # recurlen.models.timescales


__all__ = ["Mamba1LM", "Mamba1Mixer"]
