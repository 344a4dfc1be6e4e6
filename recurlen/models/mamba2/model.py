"""Mamba-2 language model with a carried recurrent state.

    logits, state = model(input_ids, state)        # state in, final state out

Parameter names and shapes are those of the official state-spaces/mamba2-* checkpoints:
    backbone.embedding.weight                       (V_pad, D)
    backbone.layers.{i}.norm.weight                 (D,)
    backbone.layers.{i}.mixer.in_proj.weight        (2*d_inner + 2*G*N + H, D)   -> [z | xBC | dt]
    backbone.layers.{i}.mixer.conv1d.{weight,bias}  (conv_dim, 1, d_conv), (conv_dim,)
    backbone.layers.{i}.mixer.{dt_bias,A_log,D}     (H,)
    backbone.layers.{i}.mixer.norm.weight           (d_inner,)
    backbone.layers.{i}.mixer.out_proj.weight       (D, d_inner)
    backbone.norm_f.weight                          (D,)
    lm_head.weight                                  (V_pad, D), tied to the embedding

Legend: B batch, L length, D d_model, H heads, P headdim, N d_state, G groups, C conv channels,
W = d_conv - 1 carried conv inputs, K layers, V vocabulary.
"""

from __future__ import annotations

import functools
import logging

import torch
import torch.nn as nn
import torch.nn.functional as F

from recurlen.models.causal_conv import causal_conv, causal_conv_kernel
from recurlen.models.layers import GatedRMSNorm, sample_A, sample_dt_bias, up
from recurlen.models.mamba2 import kernels
from recurlen.models.mamba2.config import Mamba2Config
from recurlen.models.mamba2.kernels import KERNELS
from recurlen.models.mamba2.scan import ssd_capped, ssd_chunked, ssd_step
from recurlen.models.mamba2.state import RecurrentState
from recurlen.models.mamba2.transformers_format import TRANSFORMERS_FORMAT
from recurlen.models.mixer_model import MixerModelLM
from recurlen.models.resets import seq_idx
from recurlen.models.timescales import kernel_dt, scaled, select_tokens

# The scan's result does not depend on the chunk length, only its cost does: inside a chunk the work is
# (chunk x chunk) elementwise passes per head, which are memory-bound on a CPU. At the official shapes
# (chunk 256) chunks of 64 make a 130m training step ~10% faster on CPU; GPUs keep the configured one.
CPU_MAX_CHUNK = 64

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=1)
def _warn_stuffed_on_torch_scan() -> None:
    log.warning("Mamba-2 with a decay scale or a state norm cap (fix stuffed_mamba): mamba-ssm's scan forms the decay "
                "exp(dt A) from dt and a per-head A and caps nothing, so these layers run the PyTorch scan (exact, "
                "slower)")


def torch_chunk_size(configured: int, device: torch.device) -> int:
    return configured if device.type != "cpu" else min(configured, CPU_MAX_CHUNK)


class Mamba2Mixer(nn.Module):
    def __init__(self, cfg: Mamba2Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.in_proj = nn.Linear(cfg.d_model, cfg.d_in_proj, bias=cfg.bias)
        self.conv1d = nn.Conv1d(cfg.conv_dim, cfg.conv_dim, cfg.d_conv, groups=cfg.conv_dim,
                                padding=cfg.d_conv - 1, bias=cfg.conv_bias)
        self.dt_bias = nn.Parameter(torch.empty(cfg.nheads))
        self.A_log = nn.Parameter(torch.empty(cfg.nheads))
        self.D = nn.Parameter(torch.ones(cfg.nheads))
        self.norm = GatedRMSNorm(cfg.d_inner, group_size=cfg.d_inner // cfg.ngroups, eps=cfg.norm_eps)
        self.out_proj = nn.Linear(cfg.d_inner, cfg.d_model, bias=cfg.bias)
        for p in (self.dt_bias, self.A_log, self.D):
            p._no_weight_decay = True
        # Scales of dt and A per layer set by training-free fixes (recurlen.models.timescales); None: as trained.
        self.dt_scale: torch.Tensor | None = None
        self.A_scale: torch.Tensor | None = None
        # Stuffed Mamba's other knobs (recurlen.evaluation.fixes.stuffed_mamba): B x B_scale; each token's decay x
        # decay_scale; each head's state norm capped at state_norm_max (H,) after every token. None: as trained.
        self.B_scale: torch.Tensor | None = None
        self.decay_scale: torch.Tensor | None = None
        self.state_norm_max: torch.Tensor | None = None
        # LongMamba's token filter (timescales, knob "dt_select"): a dt threshold per head (H,), 0 where the head keeps
        # every token; None: as trained.
        self.dt_select: torch.Tensor | None = None
        self.reset_ssm_parameters()

    @torch.no_grad()
    def reset_ssm_parameters(self) -> None:
        """mamba-ssm's initialisation of dt_bias, A_log and D (for training from scratch)."""
        cfg = self.cfg
        self.dt_bias.copy_(sample_dt_bias(cfg.nheads, dt_min=cfg.dt_min, dt_max=cfg.dt_max, floor=cfg.dt_init_floor))
        self.A_log.copy_(torch.log(sample_A(cfg.nheads, cfg.A_init_range, log_uniform=cfg.A_init_log_uniform)))
        self.D.fill_(1.0)

    def _split(self, zxbcdt: torch.Tensor):
        cfg = self.cfg
        return torch.split(zxbcdt, [cfg.d_inner, cfg.conv_dim, cfg.nheads], dim=-1)

    def _split_xBC(self, xBC: torch.Tensor):
        cfg = self.cfg
        gn = cfg.ngroups * cfg.d_state
        return torch.split(xBC, [cfg.d_inner, gn, gn], dim=-1)

    def forward(self, u_BLD: torch.Tensor, ssm_state_BHPN: torch.Tensor, conv_state_BCW: torch.Tensor, *,
                use_kernels: bool,
                resets: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        batch, length, _ = u_BLD.shape
        z_BLI, xBC_BLC, dt_BLH = self._split(self.in_proj(u_BLD))
        conv_weight_CK = self.conv1d.weight.squeeze(1)

        # causal-conv1d takes a seq_idx only without initial states: packed rows take the PyTorch conv.
        conv_out = causal_conv_kernel(xBC_BLC, conv_weight_CK, self.conv1d.bias, conv_state_BCW) \
            if use_kernels and resets is None else None
        if conv_out is None:
            xBC_BLC, conv_state_BCW = causal_conv(xBC_BLC, conv_weight_CK, self.conv1d.bias, conv_state_BCW,
                                                  resets_BL=resets)
            xBC_BLC = F.silu(xBC_BLC)
        else:
            xBC_BLC, conv_state_BCW = conv_out
        x_BLI, B_BLGN, C_BLGN = self._split_xBC(xBC_BLC)
        x_BLHP = x_BLI.unflatten(-1, (cfg.nheads, cfg.headdim))
        B_BLGN = scaled(B_BLGN.unflatten(-1, (cfg.ngroups, cfg.d_state)), self.B_scale)
        C_BLGN = C_BLGN.unflatten(-1, (cfg.ngroups, cfg.d_state))
        A_H = self._A()

        if use_kernels and (self.decay_scale is not None or self.state_norm_max is not None):
            _warn_stuffed_on_torch_scan()  # the kernel takes dt and A apart, and has no per-token cap
            use_kernels = False
        if use_kernels:
            dt_bias_H = self.dt_bias
            dt_limit = cfg.dt_limit
            if self.dt_scale is not None or self.dt_select is not None:
                # the kernel forms softplus(dt + dt_bias): give it the preimage of the dt formed here (clamped, scaled,
                # filtered), which it must not clamp again (a filtered 0 would become dt_limit's floor)
                dt_BLH = kernel_dt(select_tokens(self._dt(dt_BLH), self.dt_select))
                dt_bias_H, dt_limit = torch.zeros_like(self.dt_bias), (0.0, float("inf"))
            y_BLHP, ssm_state_BHPN = kernels.ssd_kernel(
                x_BLHP, dt_BLH, A_H, B_BLGN, C_BLGN, chunk_size=cfg.chunk_size, D_H=self.D,
                dt_bias_H=dt_bias_H, dt_limit=dt_limit, initial_state_BHPN=ssm_state_BHPN,
                seq_idx_BL=None if resets is None else seq_idx(resets))
            y_BLI = y_BLHP.flatten(-2)
            y_BLI = kernels.gated_rmsnorm_kernel(y_BLI, z_BLI, self.norm.weight, eps=cfg.norm_eps,
                                                 group_size=cfg.d_inner // cfg.ngroups)
        else:
            dt_BLH = select_tokens(self._dt(dt_BLH), self.dt_select)
            if self.state_norm_max is not None:
                y_BLHP, ssm_state_BHPN = ssd_capped(x_BLHP, dt_BLH, A_H, B_BLGN, C_BLGN, norm_max_H=self.state_norm_max,
                                                    initial_state_BHPN=ssm_state_BHPN, resets_BL=resets,
                                                    log_decay_shift=self._log_decay_shift())
            else:
                y_BLHP, ssm_state_BHPN = ssd_chunked(x_BLHP, dt_BLH, A_H, B_BLGN, C_BLGN,
                                                     chunk_size=torch_chunk_size(cfg.chunk_size, x_BLHP.device),
                                                     initial_state_BHPN=ssm_state_BHPN, resets_BL=resets,
                                                     log_decay_shift=self._log_decay_shift())
            y_BLHP = torch.addcmul(y_BLHP, up(x_BLHP), up(self.D)[:, None])
            y_BLI = self.norm(y_BLHP.flatten(-2).to(u_BLD.dtype), z_BLI)
        return self.out_proj(y_BLI), ssm_state_BHPN, up(conv_state_BCW)

    def _dt(self, dt_raw: torch.Tensor) -> torch.Tensor:
        dt = F.softplus(up(dt_raw) + up(self.dt_bias))
        lo, hi = self.cfg.dt_limit
        if lo > 0.0 or hi < float("inf"):
            dt = dt.clamp(min=lo, max=hi)
        return scaled(dt, self.dt_scale)

    def _A(self) -> torch.Tensor:
        return scaled(-torch.exp(up(self.A_log)), self.A_scale)

    def _log_decay_shift(self) -> torch.Tensor | None:
        return None if self.decay_scale is None else torch.log(up(self.decay_scale))

    def dt_probe(self):
        """What the token filter's calibration reads (timescales, knob "dt_select"): the submodule whose output holds
        the raw dt (in_proj: [z | xBC | dt]), the map from that output to dt per head (B, L, H) before the filter, and
        each head's decay per unit dt, |A| (H,)."""
        return self.in_proj, lambda out: self._dt(self._split(out)[2]), -self._A()

    def decay_rates(self) -> torch.Tensor:
        """(H, P, N): each state entry's decay rate per token at zero input, dt(0) x |A| of its head (every
        entry of a head decays alike)."""
        rate_H = self._dt(torch.zeros_like(self.dt_bias)) * -self._A()
        return rate_H[:, None, None].expand(self.cfg.nheads, self.cfg.headdim, self.cfg.d_state)

    def step(self, u_BD: torch.Tensor, ssm_state_BHPN: torch.Tensor, conv_state_BCW: torch.Tensor):
        """One token: the same math as forward with L = 1, without the chunk machinery."""
        cfg = self.cfg
        z_BI, xBC_BC, dt_BH = self._split(self.in_proj(u_BD))
        xBC_B1C, conv_state_BCW = causal_conv(xBC_BC.unsqueeze(1), self.conv1d.weight.squeeze(1),
                                              self.conv1d.bias, conv_state_BCW)
        x_BI, B_BG, C_BG = self._split_xBC(F.silu(xBC_B1C.squeeze(1)))
        x_BHP = x_BI.unflatten(-1, (cfg.nheads, cfg.headdim))
        y_BHP, ssm_state_BHPN = ssd_step(
            x_BHP, select_tokens(self._dt(dt_BH), self.dt_select), self._A(),
            scaled(B_BG.unflatten(-1, (cfg.ngroups, cfg.d_state)), self.B_scale),
            C_BG.unflatten(-1, (cfg.ngroups, cfg.d_state)), up(ssm_state_BHPN),
            log_decay_shift=self._log_decay_shift(), norm_max_H=self.state_norm_max)
        y_BHP = y_BHP + up(x_BHP) * up(self.D)[:, None]
        y_BI = self.norm(y_BHP.flatten(-2).to(u_BD.dtype), z_BI)
        return self.out_proj(y_BI), ssm_state_BHPN, up(conv_state_BCW)


class Mamba2LM(MixerModelLM):
    """Mamba-2 LM: embedding -> blocks -> norm_f -> (tied) LM head, with state in and out (the shell is
    StatefulLM's, the layout mamba-ssm's: recurlen.models.mixer_model)."""

    config_cls = Mamba2Config
    state_cls = RecurrentState
    kernels = KERNELS
    mixer_cls = Mamba2Mixer
    transformers = TRANSFORMERS_FORMAT
    supports_resets = True
    TIMESCALES = ("dt", "A", "A_log", "B", "decay", "state_norm", "dt_select")  # recurlen.models.timescales


__all__ = ["Mamba2LM", "Mamba2Mixer"]
