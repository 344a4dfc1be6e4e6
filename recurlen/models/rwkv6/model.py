"""RWKV-6 (Finch) language model (flash-linear-attention's RWKV6ForCausalLM) with a carried recurrent state.

    logits, state = model(input_ids, state)        # state in, final state out

Parameter names and shapes are fla's, i.e. those of the fla-hub/rwkv6-* checkpoints (BlinkDL's .pth names map onto
them in checkpoint.py):
    model.embeddings.weight                              (V, D)
    model.layers.0.pre_norm.{weight,bias}                (D,)          BlinkDL's ln0, first block only
    model.layers.{i}.attn_norm.{weight,bias}             (D,)
    model.layers.{i}.attn.x_proj.0.mu                    (D,)          token-shift mix feeding the low-rank mixers
    model.layers.{i}.attn.x_proj.0.linear.weight         (5 R, D)      R = proj_low_rank_dim, branches r, w, k, v, g
    model.layers.{i}.attn.x_proj.2.weight                (D, 5 R)
    model.layers.{i}.attn.x_bias                         (5, D)        static part of the five mixes
    model.layers.{i}.attn.{r,k,g}_proj.linear.weight     (key_dim | value_dim, D)
    model.layers.{i}.attn.v_proj.linear.weight           (value_dim, D)
    model.layers.{i}.attn.w_proj.linear.lora.0.weight    (Rd, D)       data-dependent decay, Rd = gate_low_rank_dim
    model.layers.{i}.attn.w_proj.linear.lora.2.{weight,bias}  (key_dim, Rd), (key_dim,)   the bias is time_decay
    model.layers.{i}.attn.bonus                          (H, Dk)       u
    model.layers.{i}.attn.g_norm.{weight,bias}           (value_dim,)  per-head GroupNorm
    model.layers.{i}.attn.o_proj.weight                  (D, value_dim)
    model.layers.{i}.ffn_norm.{weight,bias}              (D,)
    model.layers.{i}.ffn.{key,receptance}.mu             (D,)
    model.layers.{i}.ffn.key.linear.weight               (I, D)
    model.layers.{i}.ffn.receptance.linear.weight        (D, D)
    model.layers.{i}.ffn.value.weight                    (D, I)
    model.norm.{weight,bias}                             (D,)
    lm_head.weight                                       (V, D)

Legend: B batch, L length, D hidden_size, H heads, K head key dim, V head value dim, R low rank, I channel-mix width.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from recurlen.models.fla_model import FlaLM
from recurlen.models.layers import up
from recurlen.models.rwkv6 import kernels
from recurlen.models.rwkv6.checkpoint import BLINKDL_FILE, RWKV6_FORMAT
from recurlen.models.rwkv6.config import RWKV6Config
from recurlen.models.rwkv6.kernels import KERNELS
from recurlen.models.rwkv6.scan import wkv6_chunked, wkv6_step
from recurlen.models.rwkv6.state import RWKV6State
from recurlen.models.timescales import scaled


def shift_delta(x_BLD: torch.Tensor, last_BD: torch.Tensor, resets_BL: torch.Tensor | None = None) -> torch.Tensor:
    """x_{t-1} - x_t, with the carried last token of the previous call standing in for x_{-1}; where a document
    starts (resets_BL) x_{t-1} is zero, the shift state of a fresh sequence."""
    shifted = torch.cat([last_BD.to(x_BLD.dtype).unsqueeze(1), x_BLD[:, :-1]], dim=1)
    if resets_BL is not None:
        shifted = shifted * (~resets_BL).to(x_BLD.dtype).unsqueeze(-1)
    return shifted - x_BLD


class LerpLinear(nn.Module):
    """linear(x + (x_{t-1} - x_t) * mu): a static token-shift mix, then a projection."""

    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.mu = nn.Parameter(torch.zeros(d_in))
        self.linear = nn.Linear(d_in, d_out, bias=False)

    def forward(self, x: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        return self.linear(x + delta * self.mu)


class LoRA(nn.Module):
    """tanh low-rank pair with a bias on the way out: the decay's data-dependent part plus time_decay."""

    def __init__(self, d_in: int, d_out: int, rank: int) -> None:
        super().__init__()
        self.lora = nn.Sequential(nn.Linear(d_in, rank, bias=False), nn.Tanh(), nn.Linear(rank, d_out, bias=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lora(x)


class DDLerpLinear(nn.Module):
    """linear(x + (x_{t-1} - x_t) * mu_t) with a data-dependent mix mu_t (given)."""

    def __init__(self, d_in: int, d_out: int, rank: int | None = None) -> None:
        super().__init__()
        self.linear = nn.Linear(d_in, d_out, bias=False) if rank is None else LoRA(d_in, d_out, rank)

    def forward(self, x: torch.Tensor, mu: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        return self.linear(x + delta * mu)


class GroupNorm(nn.Module):
    """Per-head normalisation of the WKV output (weight and bias over all channels)."""

    def __init__(self, groups: int, dim: int, eps: float) -> None:
        super().__init__()
        self.groups, self.eps = groups, eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = up(x).reshape(-1, x.shape[-1])
        out = F.group_norm(flat, self.groups, up(self.weight), up(self.bias), self.eps)
        return out.view(x.shape).to(self.weight.dtype)


class RWKV6Attention(nn.Module):
    """The time mix: data-dependent token shift, WKV recurrence with per-channel decay and bonus, gated output."""

    LOG_RATE = "w_proj.linear.lora.2.bias"
    """time_decay (BlinkDL's name), the parameter in log space of each key channel's decay rate: the log decay is
    -exp(time_decay + lora(x)), so adding log s to it scales the log decay by s for every input
    (recurlen.models.timescales folds A scales into it, forget_more caps memories through it)."""

    def __init__(self, cfg: RWKV6Config) -> None:
        super().__init__()
        self.cfg = cfg
        d, rank = cfg.hidden_size, cfg.proj_low_rank_dim
        self.x_proj = nn.ModuleList([LerpLinear(d, 5 * rank), nn.Tanh(), nn.Linear(5 * rank, d, bias=False)])
        self.x_bias = nn.Parameter(torch.zeros(5, d))
        self.r_proj = DDLerpLinear(d, cfg.key_dim)
        self.w_proj = DDLerpLinear(d, cfg.key_dim, rank=cfg.gate_low_rank_dim)
        self.k_proj = DDLerpLinear(d, cfg.key_dim)
        self.v_proj = DDLerpLinear(d, cfg.value_dim)
        self.g_proj = DDLerpLinear(d, cfg.value_dim)
        self.bonus = nn.Parameter(torch.zeros(cfg.num_heads, cfg.head_dim))
        self.g_norm = GroupNorm(cfg.num_heads, cfg.value_dim, cfg.group_norm_eps)
        self.o_proj = nn.Linear(cfg.value_dim, d, bias=False)
        # A scale of each token's log decay per layer, set by training-free fixes (recurlen.models.timescales);
        # None: as trained.
        self.A_scale: torch.Tensor | None = None

    @property
    def time_decay(self) -> nn.Parameter:
        return self.get_parameter(self.LOG_RATE)

    def decay_rates(self) -> torch.Tensor:
        """(H, K, V): each state entry's decay rate per token at zero input, exp(time_decay) x the scale of its key
        channel (the lora adds nothing at zero input; every entry of a key row decays alike)."""
        cfg = self.cfg
        rate_HK = scaled(torch.exp(up(self.time_decay)), self.A_scale).view(cfg.num_heads, cfg.head_dim)
        return rate_HK[..., None].expand(cfg.num_heads, cfg.head_dim, cfg.head_v_dim)

    def _project(self, x_BLD: torch.Tensor, delta_BLD: torch.Tensor):
        """r, log decay, k, v per head and the output gate's input g."""
        cfg = self.cfg
        low = self.x_proj[1](self.x_proj[0](x_BLD, delta_BLD)).unflatten(-1, (5, cfg.proj_low_rank_dim))
        up_w_D5R = self.x_proj[2].weight.view(cfg.hidden_size, 5, cfg.proj_low_rank_dim)
        mix_BL5D = torch.einsum("blnr,dnr->blnd", low, up_w_D5R) + self.x_bias
        mu_r, mu_w, mu_k, mu_v, mu_g = mix_BL5D.unbind(-2)
        r = self.r_proj(x_BLD, mu_r, delta_BLD)
        w = self.w_proj(x_BLD, mu_w, delta_BLD)
        k = self.k_proj(x_BLD, mu_k, delta_BLD)
        v = self.v_proj(x_BLD, mu_v, delta_BLD)
        g = self.g_proj(x_BLD, mu_g, delta_BLD)
        heads = (cfg.num_heads, cfg.head_dim)
        # w_t = exp(-exp(w)) in (0, 1): kept as its log, -exp(w), in float32 for the cumulative sums; a fix's scale
        # multiplies it (the same as adding log s to time_decay, which fold_A_scales does).
        log_decay = scaled(-torch.exp(up(w)), self.A_scale)
        return (r.unflatten(-1, heads), log_decay.unflatten(-1, heads), k.unflatten(-1, heads),
                v.unflatten(-1, (cfg.num_heads, cfg.head_v_dim)), g)

    def _output(self, o_BLHV: torch.Tensor, g_BLD: torch.Tensor) -> torch.Tensor:
        return self.o_proj(self.g_norm(o_BLHV.flatten(-2).to(g_BLD.dtype)) * F.silu(g_BLD))

    def forward(self, x_BLD: torch.Tensor, wkv_BHKV: torch.Tensor, shift_BD: torch.Tensor, *, use_kernels: bool,
                resets: torch.Tensor | None = None):
        r, log_w, k, v, g = self._project(x_BLD, shift_delta(x_BLD, shift_BD, resets))
        if use_kernels:
            o, wkv_BHKV = kernels.chunk_rwkv6(r, k, v, log_w, self.bonus, initial_state_BHKV=wkv_BHKV,
                                              resets_BL=resets)
        else:
            o, wkv_BHKV = wkv6_chunked(r, k, v, log_w, self.bonus, chunk_size=self.cfg.chunk_size,
                                       initial_state_BHKV=wkv_BHKV, resets_BL=resets)
        return self._output(o, g), wkv_BHKV, x_BLD[:, -1]

    def step(self, x_BD: torch.Tensor, wkv_BHKV: torch.Tensor, shift_BD: torch.Tensor):
        x = x_BD.unsqueeze(1)
        r, log_w, k, v, g = self._project(x, shift_delta(x, shift_BD))
        o, wkv_BHKV = wkv6_step(r[:, 0], k[:, 0], v[:, 0], log_w[:, 0], self.bonus, state_BHKV=up(wkv_BHKV))
        return self._output(o.unsqueeze(1), g)[:, 0], wkv_BHKV, x_BD


class RWKV6FeedForward(nn.Module):
    """The channel mix: sigmoid(receptance) * value(relu(key)^2), both inputs token-shift mixed."""

    def __init__(self, cfg: RWKV6Config) -> None:
        super().__init__()
        self.key = LerpLinear(cfg.hidden_size, cfg.ffn_size)
        self.value = nn.Linear(cfg.ffn_size, cfg.hidden_size, bias=False)
        self.receptance = LerpLinear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x_BLD: torch.Tensor, shift_BD: torch.Tensor, resets: torch.Tensor | None = None):
        delta = shift_delta(x_BLD, shift_BD, resets)
        hidden = F.relu(self.key(x_BLD, delta)).square()
        return torch.sigmoid(self.receptance(x_BLD, delta)) * self.value(hidden), x_BLD[:, -1]


class RWKV6Block(nn.Module):
    def __init__(self, cfg: RWKV6Config, layer_idx: int) -> None:
        super().__init__()
        norm = lambda: nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps, bias=cfg.norm_bias)  # noqa: E731
        if cfg.norm_first and layer_idx == 0:
            self.pre_norm = norm()
        self.attn_norm = norm()
        self.attn = RWKV6Attention(cfg)
        self.ffn_norm = norm()
        self.ffn = RWKV6FeedForward(cfg)

    def _run(self, hidden: torch.Tensor, parts, attn, resets: torch.Tensor | None = None):
        wkv, att_shift, ffn_shift = parts
        residual = self.pre_norm(hidden) if hasattr(self, "pre_norm") else hidden
        mixed, wkv, att_shift = attn(self.attn_norm(residual), wkv, att_shift)
        residual = residual + mixed
        squeeze = residual.dim() == 2  # one token (step): the channel mix takes (B, 1, D)
        normed = self.ffn_norm(residual.unsqueeze(1) if squeeze else residual)
        out, ffn_shift = self.ffn(normed, ffn_shift, resets)
        out = out[:, 0] if squeeze else out
        return residual + out, (wkv, att_shift, ffn_shift)

    def forward(self, hidden: torch.Tensor, parts: tuple[torch.Tensor, ...], *, use_kernels: bool,
                resets: torch.Tensor | None = None):
        return self._run(hidden, parts, lambda x, s, sh: self.attn(x, s, sh, use_kernels=use_kernels, resets=resets),
                         resets)

    def step(self, hidden: torch.Tensor, parts: tuple[torch.Tensor, ...]):
        return self._run(hidden, parts, self.attn.step)


class RWKV6LM(FlaLM):
    """RWKV-6 LM: embeddings -> (time mix + channel mix) blocks -> norm -> LM head, with state in and out (the shell
    is StatefulLM's, the layout FlaLM's)."""

    config_cls = RWKV6Config
    state_cls = RWKV6State
    kernels = KERNELS
    official = RWKV6_FORMAT
    weights_file = BLINKDL_FILE
    supports_resets = True
    # RWKV-6: A and A_log; its log decay is -exp(time_decay + lora(x)), so a scale folds exactly into time_decay (the
    # mixer's LOG_RATE); no dt that also scales the input (recurlen.models.timescales).
    TIMESCALES = ("A", "A_log")

    @staticmethod
    def make_blocks(config: RWKV6Config) -> list[nn.Module]:
        return [RWKV6Block(config, i) for i in range(config.num_hidden_layers)]

    @staticmethod
    def make_norm(config: RWKV6Config) -> nn.Module:
        return nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)

    @staticmethod
    def residual_outputs(block: RWKV6Block) -> tuple[nn.Linear, ...]:
        return block.attn.o_proj, block.ffn.value

    def init_block(self, block: RWKV6Block) -> None:
        """The time mix's r, k, v and gate projections orthogonal, and the channel mix's key orthogonal with gain
        sqrt(I / D), as BlinkDL's are (with N(0, 0.02) the output gate and the squared ReLU start near zero: an
        untrained block would barely read its input's past); token-shift mixes at 0.5 (half the previous token);
        the decay bias from decay_init_range when set (spread over each head's key channels)."""
        cfg, attn, ffn = self.config, block.attn, block.ffn
        nn.init.orthogonal_(ffn.key.linear.weight, gain=math.sqrt(cfg.ffn_size / cfg.hidden_size))
        for proj in (attn.r_proj, attn.k_proj, attn.v_proj, attn.g_proj):
            nn.init.orthogonal_(proj.linear.weight)
        for mu in (attn.x_proj[0].mu, attn.x_bias, ffn.key.mu, ffn.receptance.mu):
            mu.fill_(0.5)
        if cfg.decay_init_range is not None:
            ramp = torch.linspace(*cfg.decay_init_range, cfg.head_dim).repeat(cfg.num_heads)
            attn.w_proj.linear.lora[2].bias.copy_(ramp)


__all__ = ["RWKV6Attention", "RWKV6LM"]
