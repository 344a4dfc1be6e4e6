"""Gated DeltaNet language model (flash-linear-attention's GatedDeltaNetForCausalLM) with a carried state.

    logits, state = model(input_ids, state)        # state in, final state out

Parameter names and shapes are fla's, so a checkpoint in fla's format loads without renaming:
    model.embeddings.weight                          (V, D)
    model.layers.{i}.attn_norm.weight                (D,)
    model.layers.{i}.attn.{q,k}_proj.weight          (H Dk, D)
    model.layers.{i}.attn.v_proj.weight              (Hv Dv, D)
    model.layers.{i}.attn.{a,b}_proj.weight          (Hv, D)      decay input, beta logits
    model.layers.{i}.attn.A_log, dt_bias             (Hv,)        g = -exp(A_log) softplus(a_proj(x) + dt_bias)
    model.layers.{i}.attn.{q,k,v}_conv1d.weight      (channels, 1, conv_size)  with use_short_conv
    model.layers.{i}.attn.g_proj.weight              (Hv Dv, D)   output gate, with use_gate
    model.layers.{i}.attn.o_norm.weight              (Dv,)
    model.layers.{i}.attn.o_proj.weight              (D, Hv Dv)
    model.layers.{i}.mlp_norm.weight                 (D,)
    model.layers.{i}.mlp.{gate,up}_proj.weight       (I, D)
    model.layers.{i}.mlp.down_proj.weight            (D, I)
    model.norm.weight                                (D,)
    lm_head.weight                                   (V, D)

Legend: B batch, L length, D hidden_size, H query / key heads, Hv value heads, K (Dk) head key dim, V (Dv) head
value dim, I MLP width, C conv channels, W conv_size - 1.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from recurlen.models.causal_conv import causal_conv
from recurlen.models.fla_model import FlaBlock, FlaLM
from recurlen.models.gated_deltanet import kernels
from recurlen.models.gated_deltanet.checkpoint import GATED_DELTANET_FORMAT
from recurlen.models.gated_deltanet.config import GatedDeltaNetConfig
from recurlen.models.gated_deltanet.kernels import KERNELS
from recurlen.models.gated_deltanet.scan import gated_delta_chunked, gated_delta_step
from recurlen.models.gated_deltanet.state import GatedDeltaNetState
from recurlen.models.layers import RMSNorm, sample_dt_bias, up
from recurlen.models.timescales import scaled

L2_EPS = 1e-6
"""fla's l2norm: x / sqrt(sum x^2 + eps)."""


def l2_normalise(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + L2_EPS)


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg: GatedDeltaNetConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.hidden_size
        self.q_proj = nn.Linear(d, cfg.key_dim, bias=False)
        self.k_proj = nn.Linear(d, cfg.key_dim, bias=False)
        self.v_proj = nn.Linear(d, cfg.value_dim, bias=False)
        self.a_proj = nn.Linear(d, cfg.num_v_heads, bias=False)
        self.b_proj = nn.Linear(d, cfg.num_v_heads, bias=False)
        self.A_log = nn.Parameter(torch.zeros(cfg.num_v_heads))
        self.dt_bias = nn.Parameter(torch.zeros(cfg.num_v_heads))
        if cfg.use_short_conv:
            self.q_conv1d, self.k_conv1d, self.v_conv1d = (
                nn.Conv1d(c, c, cfg.conv_size, groups=c, padding=cfg.conv_size - 1, bias=False)
                for c in (cfg.key_dim, cfg.key_dim, cfg.value_dim))
        if cfg.use_gate:
            self.g_proj = nn.Linear(d, cfg.value_dim, bias=False)
        self.o_norm = RMSNorm(cfg.head_v_dim, eps=cfg.norm_eps)
        self.o_proj = nn.Linear(cfg.value_dim, d, bias=False)
        # A scale of each token's log decay per layer, set by training-free fixes (recurlen.models.timescales);
        # None: as trained.
        self.A_scale: torch.Tensor | None = None

    @torch.no_grad()
    def reset_decays(self) -> None:
        """fla's init: A uniform in (0, 16) (stored as log A), or log-uniform in A_init_range when set; dt
        log-uniform in [0.001, 0.1] (stored as softplus^-1(dt), at least 1e-4)."""
        if self.cfg.A_init_range is None:
            self.A_log.copy_(torch.empty_like(self.A_log).uniform_(0, 16).log())
        else:
            lo, hi = self.cfg.A_init_range
            self.A_log.copy_(torch.empty_like(self.A_log).uniform_(math.log(lo), math.log(hi)))
        self.dt_bias.copy_(sample_dt_bias(self.cfg.num_v_heads, dt_min=0.001, dt_max=0.1, floor=1e-4))

    def _qkv(self, x_BLD: torch.Tensor, conv_state_BCW: torch.Tensor, resets: torch.Tensor | None = None):
        """q, k, v through the short convs + SiLU (or SiLU alone without them); the new conv window."""
        q, k, v = self.q_proj(x_BLD), self.k_proj(x_BLD), self.v_proj(x_BLD)
        if not self.cfg.use_short_conv:
            return F.silu(q), F.silu(k), F.silu(v), conv_state_BCW
        outs, windows = [], []
        for t, conv, window in zip((q, k, v), (self.q_conv1d, self.k_conv1d, self.v_conv1d),
                                   conv_state_BCW.split([q.shape[-1], k.shape[-1], v.shape[-1]], dim=1)):
            out, window = causal_conv(t, conv.weight.squeeze(1), conv.bias, window, resets_BL=resets)
            outs.append(F.silu(out))
            windows.append(window)
        return (*outs, torch.cat(windows, dim=1))

    def _heads(self, q, k, v):
        cfg = self.cfg
        q, k = (t.unflatten(-1, (cfg.num_heads, cfg.head_dim)) for t in (q, k))
        return q, k, v.unflatten(-1, (cfg.num_v_heads, cfg.head_v_dim))

    def _log_decay(self, a: torch.Tensor) -> torch.Tensor:
        """g = -exp(A_log) softplus(a + dt_bias), times the scale, then the config's clamp (float32).

        The scale comes before the clamp, where A_log + log s puts it: so the loaded model with its scale, the kernel
        path (which is given A_log + log s) and the model with the scale folded into A_log (fold_A_scales, what a
        written model keeps; forget_more changes A_log alike) are one model. The clamp stays the configured model's
        bound: on a clamped model a scale s > 1 cannot shorten a memory past it."""
        g = scaled(-torch.exp(up(self.A_log)), self.A_scale) * F.softplus(up(a) + up(self.dt_bias))
        return g if self.cfg.clamp_min is None else g.clamp(min=self.cfg.clamp_min)

    def decay_rates(self) -> torch.Tensor:
        """(Hv, K, V): each state entry's decay rate per token at zero input, -g(0) of its value head (every entry of
        a head decays alike)."""
        cfg = self.cfg
        rate_H = -self._log_decay(torch.zeros_like(self.dt_bias))
        return rate_H[:, None, None].expand(cfg.num_v_heads, cfg.head_dim, cfg.head_v_dim)

    def _gates(self, x: torch.Tensor):
        """The log decay g (<= 0) and beta per value head, float32."""
        g = self._log_decay(self.a_proj(x))
        beta = torch.sigmoid(up(self.b_proj(x)))
        return g, 2 * beta if self.cfg.allow_neg_eigval else beta

    def _scan_inputs(self, q, k):
        """L2-normalised q, k, each q / k head repeated for the value heads it serves (fla's GVA: value head j
        reads q / k head j // v_groups)."""
        q, k = l2_normalise(up(q)), l2_normalise(up(k))
        if self.cfg.v_groups > 1:
            q, k = (t.repeat_interleave(self.cfg.v_groups, dim=-2) for t in (q, k))
        return q, k

    def _output(self, o, x):
        """Per-head RMSNorm of the output, times the gate's activation of g_proj(x), then o_proj."""
        cfg = self.cfg
        o = self.o_norm(o.to(x.dtype))
        if cfg.use_gate:
            gate = self.g_proj(x).unflatten(-1, (cfg.num_v_heads, cfg.head_v_dim))
            o = o * (torch.sigmoid(gate) if cfg.output_gate_activation == "sigmoid" else F.silu(gate))
        return self.o_proj(o.flatten(-2))

    def forward(self, x_BLD: torch.Tensor, kv_BHKV: torch.Tensor, conv_BCW: torch.Tensor, *, use_kernels: bool,
                resets: torch.Tensor | None = None):
        cfg = self.cfg
        q, k, v, conv_BCW = self._qkv(x_BLD, conv_BCW, resets)
        q, k, v = self._heads(q, k, v)
        scale = cfg.head_dim**-0.5
        if use_kernels:
            # The kernel forms g from A_log itself: a scale s reaches it as A_log + log s, exactly where _log_decay
            # puts it (before the clamp), in float32 (a bfloat16 A_log would round a small log s away).
            A_log = self.A_log if self.A_scale is None else up(self.A_log) + torch.log(self.A_scale.to(up(self.A_log)))
            o, kv_BHKV = kernels.chunk_gated_delta_rule(
                q, k, v, self.a_proj(x_BLD), self.b_proj(x_BLD), A_log=A_log, dt_bias=self.dt_bias,
                scale=scale, allow_neg_eigval=cfg.allow_neg_eigval, initial_state_BHKV=kv_BHKV, resets_BL=resets,
                clamp_min=cfg.clamp_min)
        else:
            g, beta = self._gates(x_BLD)
            q, k = self._scan_inputs(q, k)
            o, kv_BHKV = gated_delta_chunked(q, k, v, g, beta, scale=scale, chunk_size=cfg.chunk_size,
                                             initial_state_BHKV=kv_BHKV, resets_BL=resets)
        return self._output(o, x_BLD), kv_BHKV, up(conv_BCW)

    def step(self, x_BD: torch.Tensor, kv_BHKV: torch.Tensor, conv_BCW: torch.Tensor):
        x = x_BD.unsqueeze(1)
        q, k, v, conv_BCW = self._qkv(x, conv_BCW)
        q, k, v = self._heads(q, k, v)
        q, k = self._scan_inputs(q, k)
        g, beta = self._gates(x)
        o, kv_BHKV = gated_delta_step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0],
                                      scale=self.cfg.head_dim**-0.5, state_BHKV=up(kv_BHKV))
        return self._output(o, x_BD), kv_BHKV, up(conv_BCW)


class GatedDeltaNetBlock(FlaBlock):
    def __init__(self, cfg: GatedDeltaNetConfig) -> None:
        super().__init__(GatedDeltaNet(cfg), hidden_size=cfg.hidden_size, mlp_width=cfg.mlp_size, eps=cfg.norm_eps)


class GatedDeltaNetLM(FlaLM):
    """Gated DeltaNet LM: embeddings -> (Gated DeltaNet + gated MLP) blocks -> norm -> LM head, with state in and
    out (the shell is StatefulLM's, the layout FlaLM's)."""

    config_cls = GatedDeltaNetConfig
    state_cls = GatedDeltaNetState
    kernels = KERNELS
    official = GATED_DELTANET_FORMAT
    supports_resets = True
    # Gated DeltaNet: A and A_log; g = -exp(A_log) softplus(a_proj(x) + dt_bias), so a scale folds exactly into A_log.
    # Its dt multiplies the decay alone (no input term), so a dt scale would be an A scale: no "dt"
    # (recurlen.models.timescales).
    TIMESCALES = ("A", "A_log")

    @staticmethod
    def make_blocks(config: GatedDeltaNetConfig) -> list[nn.Module]:
        return [GatedDeltaNetBlock(config) for _ in range(config.num_hidden_layers)]

    @staticmethod
    def make_norm(config: GatedDeltaNetConfig) -> nn.Module:
        return RMSNorm(config.hidden_size, eps=config.norm_eps)

    @staticmethod
    def residual_outputs(block: GatedDeltaNetBlock) -> tuple[nn.Linear, ...]:
        """None: fla's GatedDeltaNet `_init_weights` rescales o_proj / down_proj only when asked
        (prenorm_residual_strategy, None in `post_init`), so its from-scratch models keep N(0, initializer_range)."""
        return ()

    def init_block(self, block: GatedDeltaNetBlock) -> None:
        block.attn.reset_decays()


__all__ = ["GatedDeltaNet", "GatedDeltaNetLM"]
