"""GLA language model (flash-linear-attention's GLAForCausalLM) with a carried recurrent state.

    logits, state = model(input_ids, state)        # state in, final state out

Parameter names and shapes are fla's, i.e. those of the fla-hub/gla-* checkpoints:
    model.embeddings.weight                          (V, D)
    model.layers.{i}.attn_norm.weight                (D,)
    model.layers.{i}.attn.q_proj.weight              (key_dim, D)
    model.layers.{i}.attn.k_proj.weight              (key_dim / groups, D)
    model.layers.{i}.attn.v_proj.weight              (value_dim / groups, D)
    model.layers.{i}.attn.g_proj.weight              (value_dim, D)          output gate
    model.layers.{i}.attn.gk_proj.0.weight           (gate_low_rank_dim, D)  forget gate, low rank
    model.layers.{i}.attn.gk_proj.1.{weight,bias}    (key_dim / groups, gate_low_rank_dim), (key_dim / groups,)
    model.layers.{i}.attn.{q,k,v}_conv1d.weight      (channels, 1, conv_size)  only with use_short_conv
    model.layers.{i}.attn.g_norm_swish_gate.weight   (head_v_dim,)            `g_norm` when fuse_norm is false
    model.layers.{i}.attn.o_proj.weight              (D, value_dim)
    model.layers.{i}.mlp_norm.weight                 (D,)
    model.layers.{i}.mlp.{gate,up}_proj.weight       (I, D)
    model.layers.{i}.mlp.down_proj.weight            (D, I)
    model.norm.weight                                (D,)
    lm_head.weight                                   (V, D)

Legend: B batch, L length, D hidden_size, H heads, K head key dim, V head value dim, I MLP width,
C conv channels, W conv_size - 1.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from recurlen.models.causal_conv import causal_conv
from recurlen.models.fla_model import FlaBlock, FlaLM
from recurlen.models.gla import kernels
from recurlen.models.gla.checkpoint import GLA_FORMAT
from recurlen.models.gla.config import GLAConfig
from recurlen.models.gla.kernels import KERNELS
from recurlen.models.gla.scan import gla_chunked, gla_step
from recurlen.models.gla.state import GLAState
from recurlen.models.layers import RMSNorm, up
from recurlen.models.timescales import scaled


class GatedLinearAttention(nn.Module):
    def __init__(self, cfg: GLAConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d, g = cfg.hidden_size, cfg.kv_groups
        self.q_proj = nn.Linear(d, cfg.key_dim, bias=False)
        self.k_proj = nn.Linear(d, cfg.key_dim // g, bias=False)
        self.v_proj = nn.Linear(d, cfg.value_dim // g, bias=False)
        if cfg.use_output_gate:
            self.g_proj = nn.Linear(d, cfg.value_dim, bias=False)
        if cfg.use_short_conv:
            self.q_conv1d, self.k_conv1d, self.v_conv1d = (
                nn.Conv1d(c, c, cfg.conv_size, groups=c, padding=cfg.conv_size - 1, bias=cfg.conv_bias)
                for c in (cfg.key_dim, cfg.key_dim // g, cfg.value_dim // g))
        self.gk_proj = nn.Sequential(nn.Linear(d, cfg.gate_low_rank_dim, bias=False),
                                     nn.Linear(cfg.gate_low_rank_dim, cfg.key_dim // g, bias=True))
        self.o_proj = nn.Linear(cfg.value_dim, d, bias=False)
        norm = RMSNorm(cfg.head_v_dim, eps=cfg.norm_eps)
        if cfg.use_output_gate and cfg.fuse_norm:
            self.g_norm_swish_gate = norm
        else:
            self.g_norm = norm
        # A scale of each token's log forget gate per layer, set by training-free fixes (recurlen.models.timescales);
        # None: as trained.
        self.A_scale: torch.Tensor | None = None

    @property
    def out_norm(self) -> RMSNorm:
        return self.g_norm_swish_gate if hasattr(self, "g_norm_swish_gate") else self.g_norm

    def _convs(self, x_BLD: torch.Tensor, conv_state_BCW: torch.Tensor, resets: torch.Tensor | None = None):
        """q, k, v projections, through the short convs (+ SiLU) when configured; the new conv window."""
        q, k, v = self.q_proj(x_BLD), self.k_proj(x_BLD), self.v_proj(x_BLD)
        if not self.cfg.use_short_conv:
            return q, k, v, conv_state_BCW
        sizes = [q.shape[-1], k.shape[-1], v.shape[-1]]
        outs, windows = [], []
        for t, conv, window in zip((q, k, v), (self.q_conv1d, self.k_conv1d, self.v_conv1d),
                                   conv_state_BCW.split(sizes, dim=1)):
            out, window = causal_conv(t, conv.weight.squeeze(1), conv.bias, window, resets_BL=resets)
            outs.append(F.silu(out))
            windows.append(window)
        return (*outs, torch.cat(windows, dim=1))

    def _heads(self, q, k, v, gk):
        cfg = self.cfg
        q = q.unflatten(-1, (cfg.num_heads, cfg.head_k_dim))
        k, gk = (t.unflatten(-1, (cfg.num_kv_heads, cfg.head_k_dim)) for t in (k, gk))
        v = v.unflatten(-1, (cfg.num_kv_heads, cfg.head_v_dim))
        if cfg.kv_groups > 1:  # each key/value head serves `groups` query heads
            k, gk, v = (t.repeat_interleave(cfg.kv_groups, dim=-2) for t in (k, gk, v))
        log_forget = F.logsigmoid(up(gk)) / cfg.gate_logit_normalizer
        if cfg.clamp_min is not None:
            log_forget = log_forget.clamp(min=cfg.clamp_min)
        # The scale comes after the clamp: the scan then receives exactly s times the log decay the model forms,
        # every channel alike, those at the clamp too (the slow demo base clamps every gate at -0.01, so a scale
        # before the clamp could never shorten its memories below 100 tokens). No parameter holds the scale, so
        # nothing ties it to the clamp's other side; at s = 1 the product is the decay itself, bit for bit.
        return q, k, v, scaled(log_forget, self.A_scale)

    def _output(self, o, x):
        """Per-head RMSNorm of the output, then the swish output gate, then o_proj."""
        cfg = self.cfg
        o = self.out_norm(o.to(x.dtype))
        if cfg.use_output_gate:
            o = o * F.silu(self.g_proj(x).unflatten(-1, (cfg.num_heads, cfg.head_v_dim)))
        return self.o_proj(o.flatten(-2))

    def forward(self, x_BLD: torch.Tensor, kv_BHKV: torch.Tensor, conv_BCW: torch.Tensor, *, use_kernels: bool,
                resets: torch.Tensor | None = None):
        cfg = self.cfg
        q, k, v, conv_BCW = self._convs(x_BLD, conv_BCW, resets)
        q, k, v, g = self._heads(q, k, v, self.gk_proj(x_BLD))
        scale = cfg.head_k_dim**-0.5
        if use_kernels:
            o, kv_BHKV = kernels.chunk_gla(q, k, v, g, scale=scale, initial_state_BHKV=kv_BHKV, resets_BL=resets)
        else:
            o, kv_BHKV = gla_chunked(q, k, v, g, scale=scale, chunk_size=cfg.chunk_size, initial_state_BHKV=kv_BHKV,
                                     resets_BL=resets)
        return self._output(o, x_BLD), kv_BHKV, up(conv_BCW)

    def step(self, x_BD: torch.Tensor, kv_BHKV: torch.Tensor, conv_BCW: torch.Tensor):
        q, k, v, conv_BCW = self._convs(x_BD.unsqueeze(1), conv_BCW)
        q, k, v, g = self._heads(q, k, v, self.gk_proj(x_BD.unsqueeze(1)))
        o, kv_BHKV = gla_step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], scale=self.cfg.head_k_dim**-0.5,
                              state_BHKV=up(kv_BHKV))
        return self._output(o, x_BD), kv_BHKV, up(conv_BCW)


class GLABlock(FlaBlock):
    def __init__(self, cfg: GLAConfig) -> None:
        super().__init__(GatedLinearAttention(cfg), hidden_size=cfg.hidden_size, mlp_width=cfg.mlp_size,
                         eps=cfg.norm_eps)


class GLALM(FlaLM):
    """GLA LM: embeddings -> (GLA + gated MLP) blocks -> norm -> LM head, with state in and out (the shell is
    StatefulLM's, the layout FlaLM's)."""

    config_cls = GLAConfig
    state_cls = GLAState
    kernels = KERNELS
    official = GLA_FORMAT
    supports_resets = True
    # GLA: A only; its decay is logsigmoid(gk_proj(x)) / normalizer, no parameter to fold a scale into (no A_log), and
    # no dt that also scales the input (recurlen.models.timescales).
    TIMESCALES = ("A",)

    @staticmethod
    def make_blocks(config: GLAConfig) -> list[nn.Module]:
        return [GLABlock(config) for _ in range(config.num_hidden_layers)]

    @staticmethod
    def make_norm(config: GLAConfig) -> nn.Module:
        return RMSNorm(config.hidden_size, eps=config.norm_eps)

    @staticmethod
    def residual_outputs(block: GLABlock) -> tuple[nn.Linear, ...]:
        return block.attn.o_proj, block.mlp.down_proj

    def init_block(self, block: GLABlock) -> None:
        """The forget gates' bias from gate_bias_init_range when set."""
        if self.config.gate_bias_init_range is not None:
            block.attn.gk_proj[1].bias.uniform_(*self.config.gate_bias_init_range)


__all__ = ["GLALM", "GatedLinearAttention"]
