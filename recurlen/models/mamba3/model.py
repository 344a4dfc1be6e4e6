"""Mamba-3 (SISO) language model with a carried recurrent state.

    logits, state = model(input_ids, state)        # state in, final state out

Parameter names and shapes are those of mamba-ssm's `Mamba3` mixer inside its language-model layout:
    backbone.embedding.weight                       (V_pad, D)
    backbone.layers.{i}.norm.weight                 (D,)
    backbone.layers.{i}.mixer.in_proj.weight        (2*I + 2*G*N + 3*H + S, D)
                                                    -> [z | x | B | C | dd_dt | dd_A | trap | angles]
    backbone.layers.{i}.mixer.{dt_bias,D}           (H,)
    backbone.layers.{i}.mixer.{B_bias,C_bias}       (H, 1, N)
    backbone.layers.{i}.mixer.{B_norm,C_norm}.weight (N,)
    backbone.layers.{i}.mixer.norm.weight           (d_inner,)   only with is_outproj_norm
    backbone.layers.{i}.mixer.out_proj.weight       (D, d_inner)
    backbone.norm_f.weight                          (D,)
    lm_head.weight                                  (V_pad, D), tied to the embedding

Legend: B batch, L length, D d_model, H heads, P headdim, N d_state, G groups, S angles per head, I d_inner.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from recurlen.models.layers import RMSNorm, sample_dt_bias, up
from recurlen.models.mamba3 import kernels
from recurlen.models.mamba3.config import MIXER_NORM_EPS, Mamba3Config
from recurlen.models.mamba3.kernels import KERNELS
from recurlen.models.mamba3.scan import mamba3_chunked, mamba3_step
from recurlen.models.mamba3.state import Mamba3State
from recurlen.models.mixer_model import MixerModelLM
from recurlen.models.official import WEIGHTS_NAME, OfficialFormat
from recurlen.models.timescales import scaled

# mamba-ssm 2.3.2's MambaLMHeadModel builds Mamba1 and Mamba2 layers only; its Mamba3 module reads a layer's
# mixer.* weights as they are written here.
MAMBA3_FORMAT = OfficialFormat(
    weights=WEIGHTS_NAME, embedding_key="backbone.embedding.weight", tie_flag="tie_embeddings", library="mamba-ssm",
    loading="from mamba_ssm.modules.mamba3 import Mamba3; Mamba3(d_model, **ssm_cfg).load_state_dict(layer's "
            "mixer.* weights of DIR/pytorch_model.bin)")


class HeadGatedRMSNorm(nn.Module):
    """rmsnorm(y) per head of P channels, times weight, times silu(z): mamba-ssm's RMSNormGated with
    norm_before_gate=True and group_size=headdim (Mamba-3's is_outproj_norm)."""

    def __init__(self, dim: int, group_size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.group_size = group_size
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, y_BLI: torch.Tensor, z_BLI: torch.Tensor) -> torch.Tensor:
        normed = F.rms_norm(up(y_BLI).unflatten(-1, (-1, self.group_size)), (self.group_size,), None, self.eps)
        return normed.flatten(-2) * up(self.weight) * F.silu(up(z_BLI))


class Mamba3Mixer(nn.Module):
    def __init__(self, cfg: Mamba3Config) -> None:
        super().__init__()
        self.cfg = cfg
        h, n = cfg.nheads, cfg.d_state
        self.in_proj = nn.Linear(cfg.d_model, cfg.d_in_proj, bias=False)
        self.dt_bias = nn.Parameter(torch.empty(h))
        self.B_bias = nn.Parameter(torch.ones(h, 1, n))  # (heads, SISO rank 1, d_state), as mamba-ssm stores them
        self.C_bias = nn.Parameter(torch.ones(h, 1, n))
        self.B_norm = RMSNorm(n, eps=MIXER_NORM_EPS)
        self.C_norm = RMSNorm(n, eps=MIXER_NORM_EPS)
        self.D = nn.Parameter(torch.ones(h))
        if cfg.is_outproj_norm:
            self.norm = HeadGatedRMSNorm(cfg.d_inner, cfg.headdim, eps=MIXER_NORM_EPS)
        self.out_proj = nn.Linear(cfg.d_inner, cfg.d_model, bias=False)
        for p in (self.dt_bias, self.D):
            p._no_weight_decay = True
        # Scales of dt and A per layer set by training-free fixes (recurlen.models.timescales); None: as trained.
        self.dt_scale: torch.Tensor | None = None
        self.A_scale: torch.Tensor | None = None
        self.reset_ssm_parameters()

    @torch.no_grad()
    def reset_ssm_parameters(self) -> None:
        """mamba-ssm's Mamba3 initialisation: dt log-uniform in [dt_min, dt_max] as softplus^-1, B / C biases 1, D 1."""
        cfg = self.cfg
        self.dt_bias.copy_(sample_dt_bias(cfg.nheads, dt_min=cfg.dt_min, dt_max=cfg.dt_max, floor=cfg.dt_init_floor))
        self.B_bias.fill_(1.0)
        self.C_bias.fill_(1.0)
        self.D.fill_(1.0)

    def _inputs(self, u: torch.Tensor):
        """in_proj split and activated: z, x (.., H, P), B, C (.., G, N), adt, dt, trap (.., H), angles (.., H, S)."""
        cfg = self.cfg
        gn = cfg.ngroups * cfg.d_state
        z, x, B, C, dd_dt, dd_A, trap, angles = torch.split(
            self.in_proj(u), [cfg.d_inner, cfg.d_inner, gn, gn, cfg.nheads, cfg.nheads, cfg.nheads,
                              cfg.num_rope_angles], dim=-1)
        A = scaled(torch.clamp(-F.softplus(up(dd_A)), max=-cfg.A_floor), self.A_scale)
        dt = scaled(F.softplus(up(dd_dt) + up(self.dt_bias)), self.dt_scale)
        B = self.B_norm(B.unflatten(-1, (cfg.ngroups, cfg.d_state)))
        C = self.C_norm(C.unflatten(-1, (cfg.ngroups, cfg.d_state)))
        angles = angles.unsqueeze(-2).expand(*angles.shape[:-1], cfg.nheads, cfg.num_rope_angles)
        x = x.unflatten(-1, (cfg.nheads, cfg.headdim))
        adt = A * dt
        if cfg.log_decay_min is not None:  # the model organism's clamp (config.log_decay_min): no gradient below it
            adt = adt.clamp(min=cfg.log_decay_min)
        return z, x, B, C, adt, dt, trap, angles

    def _output(self, y_xHP: torch.Tensor, z_xI: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The gate (norm) and out_proj on y, which already has the D skip (and silu(z) unless is_outproj_norm)."""
        y = y_xHP.flatten(-2)
        if self.cfg.is_outproj_norm:
            y = self.norm(y, z_xI)
        return self.out_proj(y.to(dtype))

    def _skip_and_gate(self, y_xHP: torch.Tensor, x_xHP: torch.Tensor, z_xI: torch.Tensor) -> torch.Tensor:
        y = y_xHP + up(x_xHP) * up(self.D)[:, None]
        return y if self.cfg.is_outproj_norm else y * F.silu(up(z_xI)).unflatten(-1, x_xHP.shape[-2:])

    def forward(self, u_BLD: torch.Tensor, ssm_BHPN: torch.Tensor, angle_BHS: torch.Tensor, k_BHN: torch.Tensor,
                v_BHP: torch.Tensor, *, use_kernels: bool, resets: torch.Tensor | None = None):
        z, x, B, C, adt, dt, trap, angles = self._inputs(u_BLD)
        biases = self.C_bias[:, 0], self.B_bias[:, 0]
        state = (ssm_BHPN, angle_BHS, k_BHN, v_BHP)
        if use_kernels:
            y, state = kernels.siso_kernel(C, B, x, adt, dt, trap, angles, *biases, D=self.D,
                                           z=None if self.cfg.is_outproj_norm else z, chunk_size=self.cfg.chunk_size,
                                           initial=state, resets_BL=resets)
        else:
            y, state = mamba3_chunked(C, B, x, adt, dt, trap, angles, *biases, chunk_size=self.cfg.chunk_size,
                                      initial=state, resets_BL=resets)
            y = self._skip_and_gate(y, x, z)
        return (self._output(y, z, u_BLD.dtype), *state)

    def step(self, u_BD: torch.Tensor, ssm_BHPN: torch.Tensor, angle_BHS: torch.Tensor, k_BHN: torch.Tensor,
             v_BHP: torch.Tensor):
        """One token: the recurrence as written, without the chunk machinery."""
        z, x, B, C, adt, dt, trap, angles = self._inputs(u_BD)
        y, state = mamba3_step(C, B, x, adt, dt, trap, angles, self.C_bias[:, 0], self.B_bias[:, 0],
                               (ssm_BHPN, angle_BHS, k_BHN, v_BHP))
        return (self._output(self._skip_and_gate(y, x, z), z, u_BD.dtype), *state)


class Mamba3LM(MixerModelLM):
    """Mamba-3 LM: embedding -> blocks -> norm_f -> (tied) LM head, with state in and out (the shell is StatefulLM's,
    the layout mamba-ssm's: recurlen.models.mixer_model)."""

    config_cls = Mamba3Config
    state_cls = Mamba3State
    kernels = KERNELS
    mixer_cls = Mamba3Mixer
    official = MAMBA3_FORMAT
    TIMESCALES = ("dt", "A")  # recurlen.models.timescales; its A comes from the input, so no A_log to fold into
    # No "dt_select" (LongMamba's token filter, dt = 0 for the tokens it drops): the trapezoid's second input term
    # beta_t v_t-1 k_t-1^T is weighed by dt_t, so dt_t = 0 would also drop half of the token before, and the dropped
    # token's own half would still enter at t+1 (beta_t+1): the filter would not act on one token, as it does on
    # Mamba-1 and Mamba-2, where a token at dt = 0 leaves the state exactly as it was.
    supports_resets = True

    def state_decays(self) -> dict[str, torch.Tensor]:
        """Empty: Mamba-3's decay A_t = -softplus(dd_A_t) is computed from the input, not a parameter."""
        return {}


__all__ = ["Mamba3LM", "Mamba3Mixer"]
