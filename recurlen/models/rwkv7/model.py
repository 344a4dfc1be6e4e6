"""RWKV-7 ("Goose") language model (flash-linear-attention's RWKV7ForCausalLM) with a carried recurrent state.

    logits, state = model(input_ids, state)        # state in, final state out

Parameter names and shapes are fla's, i.e. those of the fla-hub/rwkv7-* checkpoints (BlinkDL's x070 .pth names map
onto them in checkpoint.py):
    model.embeddings.weight                              (V, D)
    model.layers.0.pre_norm.{weight,bias}                (D,)          BlinkDL's ln0, first block only
    model.layers.{i}.attn_norm.{weight,bias}             (D,)
    model.layers.{i}.attn.x_{r,w,k,v,a,g}                (1, 1, D)     token-shift mixes
    model.layers.{i}.attn.{r,k,v}_proj.weight            (D, D)
    model.layers.{i}.attn.w_lora.lora.{0,2}.weight       (Rw, D), (D, Rw)   decay, tanh between; lora.2.bias = w0
    model.layers.{i}.attn.a_lora.lora.{0,2}.weight       (Ra, D), (D, Ra)   in-context learning rate; bias = a0
    model.layers.{i}.attn.v_lora.lora.{0,2}.weight       (Rv, D), (D, Rv)   value residual, layers after the first
    model.layers.{i}.attn.g_lora.lora.{0,2}.weight       (Rg, D), (D, Rg)   output gate, sigmoid between, no bias
    model.layers.{i}.attn.k_k, k_a                       (D,)          removal key scale, key mix towards alpha
    model.layers.{i}.attn.r_k                            (H, N)        bonus of the current token
    model.layers.{i}.attn.g_norm.{weight,bias}           (D,)          per-head GroupNorm
    model.layers.{i}.attn.o_proj.weight                  (D, D)
    model.layers.{i}.ffn_norm.{weight,bias}              (D,)
    model.layers.{i}.ffn.x_k                             (D,)
    model.layers.{i}.ffn.key.weight, value.weight        (I, D), (D, I)
    model.norm.{weight,bias}                             (D,)
    lm_head.weight                                       (V, D)

Per token and head (the paper's equations; BlinkDL's RWKV_x070_TMix):
    x_* = x + (x_{t-1} - x) * mu_*          token shift
    r, k, v = R x_r, K x_k, V x_v;  w = exp(-exp(-1/2) sigmoid(w_lora(x_w)))
    v = lerp(v, v_first, sigmoid(v_lora(x_v)))   (after the first layer; v_first = the first layer's v)
    alpha = sigmoid(a_lora(x_a));  kappa = normalize(k * k_k);  k = k * (1 + (alpha - 1) * k_a)
    S = (diag(w) - (kappa * alpha) kappa^T) S + k v^T;  o = S^T r
    out = O (g_lora(x_g) * (groupnorm(o) + (r . (k * r_k)) v))

Legend: B batch, L length, D hidden_size, H heads, N head dim, R low rank, I channel-mix width.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from recurlen.models.fla_model import FlaLM
from recurlen.models.layers import up
from recurlen.models.rwkv7 import kernels
from recurlen.models.rwkv7.checkpoint import BLINKDL_FILE, RWKV7_FORMAT
from recurlen.models.rwkv7.config import RWKV7Config
from recurlen.models.rwkv7.kernels import KERNELS
from recurlen.models.rwkv7.scan import LOG_DECAY_FLOOR, SCALED_LOG_DECAY_MIN, chunk_for, wkv7_chunked, wkv7_step
from recurlen.models.rwkv7.state import RWKV7State


def shift_delta(x_BLD: torch.Tensor, last_BD: torch.Tensor, resets_BL: torch.Tensor | None = None) -> torch.Tensor:
    """x_{t-1} - x_t, with the carried last token of the previous call standing in for x_{-1}; where a document
    starts (resets_BL) x_{t-1} is zero, the shift state of a fresh sequence."""
    shifted = torch.cat([last_BD.to(x_BLD.dtype).unsqueeze(1), x_BLD[:, :-1]], dim=1)
    if resets_BL is not None:
        shifted = shifted * (~resets_BL).to(x_BLD.dtype).unsqueeze(-1)
    return shifted - x_BLD


class LoRA(nn.Module):
    """fla's LoRA: lora.2(act(lora.0(x))), the second linear's bias being BlinkDL's static offset (w0, a0, v0)."""

    def __init__(self, d_in: int, d_out: int, rank: int, activation: nn.Module, *, bias: bool = True) -> None:
        super().__init__()
        self.lora = nn.Sequential(nn.Linear(d_in, rank, bias=False), activation, nn.Linear(rank, d_out, bias=bias))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lora(x)

    @torch.no_grad()
    def reset(self, offset: torch.Tensor | None = None) -> None:
        """fla's init: the first linear zero, the second orthogonal times 0.1, the offset given (else zero)."""
        nn.init.zeros_(self.lora[0].weight)
        out, rank = self.lora[2].weight.shape
        nn.init.orthogonal_(self.lora[2].weight, gain=0.1 * (math.sqrt(rank / out) if rank > out else 1.0))
        if self.lora[2].bias is not None:
            self.lora[2].bias.copy_(torch.zeros(out) if offset is None else offset)


class RWKV7Attention(nn.Module):
    """The time mix: token shift, the generalised delta rule with vector decay, the value residual, gated output."""

    def __init__(self, cfg: RWKV7Config, layer_idx: int) -> None:
        super().__init__()
        self.cfg, self.layer_idx = cfg, layer_idx
        d = cfg.hidden_size
        for mix in "rwkvag":
            setattr(self, f"x_{mix}", nn.Parameter(torch.zeros(1, 1, d)))
        self.k_k = nn.Parameter(torch.zeros(d))
        self.k_a = nn.Parameter(torch.zeros(d))
        self.r_k = nn.Parameter(torch.zeros(cfg.num_heads, cfg.head_dim))
        self.r_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        self.w_lora = LoRA(d, d, cfg.decay_low_rank_dim, nn.Tanh())
        if layer_idx != 0:
            self.v_lora = LoRA(d, d, cfg.v_low_rank_dim, nn.Identity())
        self.a_lora = LoRA(d, d, cfg.a_low_rank_dim, nn.Identity())
        self.g_lora = LoRA(d, d, cfg.gate_low_rank_dim, nn.Sigmoid(), bias=False)
        self.g_norm = nn.GroupNorm(cfg.num_heads, d, eps=cfg.group_norm_eps)
        # A scale of each token's log decay per layer, set by training-free fixes (recurlen.models.timescales);
        # None: as trained.
        self.A_scale: torch.Tensor | None = None

    def _log_decay_floor(self) -> float:
        """The smallest log decay per token the scan may receive: RWKV-7's floor, times the scale where a fix
        scales the decay by more than 1 (down to SCALED_LOG_DECAY_MIN)."""
        if self.A_scale is None or not float(self.A_scale.detach()) > 1.0:
            return LOG_DECAY_FLOOR
        return max(LOG_DECAY_FLOOR * float(self.A_scale.detach()), SCALED_LOG_DECAY_MIN)

    def _project(self, x_BLD: torch.Tensor, delta_BLD: torch.Tensor, v_first: torch.Tensor | None):
        """Per head: r, log decay, k, v, the rank-one vectors a = -kappa and b = kappa alpha; the gate; v_first."""
        cfg = self.cfg
        # The six mixes in one product: autograd keeps delta once, not once per mix.
        mu_6D = torch.cat([getattr(self, f"x_{m}").view(1, -1) for m in "rwkvag"])
        xr, xw, xk, xv, xa, xg = (x_BLD.unsqueeze(-2) + delta_BLD.unsqueeze(-2) * mu_6D).unbind(-2)
        r = self.r_proj(xr)
        log_w = LOG_DECAY_FLOOR * torch.sigmoid(up(self.w_lora(xw)))  # float32: exponentiated and summed
        if cfg.log_decay_min is not None:  # the model organism's clamp (config.log_decay_min): no gradient below it
            log_w = log_w.clamp(min=cfg.log_decay_min)
        if self.A_scale is not None:
            # After the clamp: the scan receives s times the log decay the model forms, every channel alike, those
            # at the clamp too (the slow demo base clamps every channel at -1e-4: a scale before the clamp could
            # shorten no memory below 10^4 tokens). The decay is no parameter, so nothing ties the scale to the
            # clamp's other side; x 1 is the decay itself, and the stop at SCALED_LOG_DECAY_MIN changes nothing a
            # float holds.
            log_w = (log_w * self.A_scale).clamp(min=SCALED_LOG_DECAY_MIN)
        k = self.k_proj(xk)
        v = self.v_proj(xv)
        if self.layer_idx == 0:
            v_first = v
        else:
            v = torch.lerp(v, v_first, torch.sigmoid(self.v_lora(xv)))
        alpha = torch.sigmoid(self.a_lora(xa))
        gate = self.g_lora(xg)
        heads = lambda t: t.unflatten(-1, (cfg.num_heads, cfg.head_dim))  # noqa: E731
        kappa = F.normalize(heads(k * self.k_k), dim=-1)
        k = k * (1 + (alpha - 1) * self.k_a)
        return heads(r), heads(log_w), heads(k), heads(v), -kappa, kappa * heads(alpha), gate, v_first

    def _output(self, o_BLHN: torch.Tensor, r: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                gate_BLD: torch.Tensor) -> torch.Tensor:
        normed = F.group_norm(up(o_BLHN).flatten(-2).flatten(0, -2), self.cfg.num_heads, up(self.g_norm.weight),
                              up(self.g_norm.bias), self.g_norm.eps).view(o_BLHN.shape[:-2] + (-1,))
        bonus = ((r * k * self.r_k).sum(-1, keepdim=True) * v).flatten(-2)  # the current token, undecayed
        return self.o_proj((normed.to(gate_BLD.dtype) + bonus) * gate_BLD)

    def forward(self, x_BLD: torch.Tensor, wkv_BHNN: torch.Tensor, shift_BD: torch.Tensor,
                v_first: torch.Tensor | None, *, use_kernels: bool, resets: torch.Tensor | None = None):
        r, log_w, k, v, a, b, gate, v_first = self._project(x_BLD, shift_delta(x_BLD, shift_BD, resets), v_first)
        floor = self._log_decay_floor()  # a decay scaled above RWKV-7's floor needs shorter chunks (scan, kernels)
        kernel_chunk = kernels.kernel_chunk(floor) if use_kernels else None
        if kernel_chunk is not None:
            o, wkv_BHNN = kernels.chunk_rwkv7(r, log_w, k, v, a, b, initial_state_BHKV=wkv_BHNN, resets_BL=resets,
                                              lower_bound=floor, chunk_size=kernel_chunk)
        else:  # the CPU path, and the kernel backend's where no chunk of fla's fits a decay scaled by ~16 or more
            chunk = self.cfg.chunk_size if floor == LOG_DECAY_FLOOR else chunk_for(self.cfg.chunk_size, floor)
            o, wkv_BHNN = wkv7_chunked(r, log_w, k, v, a, b, chunk_size=chunk, initial_state_BHKV=wkv_BHNN,
                                       resets_BL=resets)
        return self._output(o, r, k, v, gate), wkv_BHNN, x_BLD[:, -1], v_first

    def step(self, x_BD: torch.Tensor, wkv_BHNN: torch.Tensor, shift_BD: torch.Tensor, v_first: torch.Tensor | None):
        x = x_BD.unsqueeze(1)
        r, log_w, k, v, a, b, gate, v_first = self._project(x, shift_delta(x, shift_BD), v_first)
        o, wkv_BHNN = wkv7_step(r[:, 0], log_w[:, 0], k[:, 0], v[:, 0], a[:, 0], b[:, 0], state_BHKV=up(wkv_BHNN))
        return self._output(o.unsqueeze(1), r, k, v, gate)[:, 0], wkv_BHNN, x_BD, v_first


class RWKV7FeedForward(nn.Module):
    """The channel mix: value(relu(key(x + (x_{t-1} - x) * x_k))^2) (no receptance gate, unlike RWKV-6's)."""

    def __init__(self, cfg: RWKV7Config) -> None:
        super().__init__()
        self.x_k = nn.Parameter(torch.zeros(cfg.hidden_size))
        self.key = nn.Linear(cfg.hidden_size, cfg.ffn_size, bias=False)
        self.value = nn.Linear(cfg.ffn_size, cfg.hidden_size, bias=False)

    def forward(self, x_BLD: torch.Tensor, shift_BD: torch.Tensor, resets: torch.Tensor | None = None):
        hidden = F.relu(self.key(x_BLD + shift_delta(x_BLD, shift_BD, resets) * self.x_k)).square()
        return self.value(hidden), x_BLD[:, -1]


class RWKV7Block(nn.Module):
    """Pre-norm time mix and channel mix. The carry between blocks is (hidden, v_first): v_first is the first
    layer's value at each position, a value passed across layers within a token, not a state (see state.py)."""

    def __init__(self, cfg: RWKV7Config, layer_idx: int) -> None:
        super().__init__()
        norm = lambda: nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps, bias=cfg.norm_bias)  # noqa: E731
        if cfg.norm_first and layer_idx == 0:
            self.pre_norm = norm()
        self.attn_norm = norm()
        self.attn = RWKV7Attention(cfg, layer_idx)
        self.ffn_norm = norm()
        self.ffn = RWKV7FeedForward(cfg)

    def _run(self, carry, parts, attn, resets: torch.Tensor | None = None):
        hidden, v_first = carry
        wkv, att_shift, ffn_shift = parts
        residual = self.pre_norm(hidden) if hasattr(self, "pre_norm") else hidden
        mixed, wkv, att_shift, v_first = attn(self.attn_norm(residual), wkv, att_shift, v_first)
        residual = residual + mixed
        squeeze = residual.dim() == 2  # one token (step): the channel mix takes (B, 1, D)
        normed = self.ffn_norm(residual.unsqueeze(1) if squeeze else residual)
        out, ffn_shift = self.ffn(normed, ffn_shift, resets)
        out = out[:, 0] if squeeze else out
        return (residual + out, v_first), (wkv, att_shift, ffn_shift)

    def forward(self, carry, parts: tuple[torch.Tensor, ...], *, use_kernels: bool,
                resets: torch.Tensor | None = None):
        """`resets` (documents packed in the row, recurlen.models.resets) restart the WKV state and both token
        shifts where a document starts; v_first needs none (it never crosses positions)."""
        return self._run(carry, parts, lambda x, s, sh, vf: self.attn(x, s, sh, vf, use_kernels=use_kernels,
                                                                      resets=resets), resets)

    def step(self, carry, parts: tuple[torch.Tensor, ...]):
        return self._run(carry, parts, self.attn.step)


class RWKV7LM(FlaLM):
    """RWKV-7 LM: embeddings -> (time mix + channel mix) blocks -> norm -> LM head, with state in and out (the shell
    is StatefulLM's, the layout FlaLM's)."""

    config_cls = RWKV7Config
    state_cls = RWKV7State
    kernels = KERNELS
    official = RWKV7_FORMAT
    weights_file = BLINKDL_FILE
    supports_resets = True
    # RWKV-7: A only; its log decay is -exp(-1/2) sigmoid(w_lora(x)), no parameter to fold a scale into (w0 sits
    # inside the sigmoid), and no dt that also scales the input (recurlen.models.timescales).
    TIMESCALES = ("A",)

    @staticmethod
    def make_blocks(config: RWKV7Config) -> list[nn.Module]:
        return [RWKV7Block(config, i) for i in range(config.num_hidden_layers)]

    @staticmethod
    def make_norm(config: RWKV7Config) -> nn.Module:
        return nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)

    @staticmethod
    def residual_outputs(block: RWKV7Block) -> tuple[nn.Linear, ...]:
        return block.attn.o_proj, block.ffn.value

    def start(self, hidden: torch.Tensor):
        return hidden, None  # the first block sets v_first

    def finish(self, carry) -> torch.Tensor:
        return self.model.norm(carry[0])

    @torch.no_grad()
    def _init_weights(self) -> None:
        """fla's RWKV7ForCausalLM from scratch (BlinkDL's x070 training init), not FlaLM's shared N(0, 0.02):
        embedding U(-1e-4, 1e-4), the head orthogonal with gain 0.5 sqrt(V / D) (0.5 when V <= D), norms at one /
        zero, and each block's own (init_block). fla's o_proj and channel-mix value start at zero: a block adds
        nothing to the residual stream until trained (fla's residual rescaling does not reach them); see
        RWKV7Config.zero_residual_init."""
        cfg = self.config
        nn.init.uniform_(self.model.embeddings.weight, -1e-4, 1e-4)
        ratio = cfg.vocab_size / cfg.hidden_size
        nn.init.orthogonal_(self.lm_head.weight, gain=0.5 * math.sqrt(ratio) if ratio > 1 else 0.5)
        for block in self.model.layers:
            self.init_block(block)

    def init_block(self, block: RWKV7Block) -> None:
        """fla's RWKV7Attention / RWKV7FeedForward init: token-shift mixes and decay offsets ramped over the channels
        and layers, orthogonal r / v (k with gain 0.1), zero output projections (unless zero_residual_init is off)."""
        cfg, attn, ffn = self.config, block.attn, block.ffn
        d, n, layers, i = cfg.hidden_size, cfg.head_dim, cfg.num_hidden_layers, attn.layer_idx
        ratio_0_to_1 = i / (layers - 1) if layers > 1 else 0.0  # fla divides by zero for one layer
        ratio_1_to_almost0 = 1.0 - i / layers
        idx = torch.arange(d, dtype=torch.float64)
        ddd = idx / d
        linear = idx / max(d - 1, 1) - 0.5
        zigzag = ((idx % n) - (n - 1) / 2) / max((n - 1) / 2, 1e-9)
        zigzag = zigzag * zigzag.abs()
        www = -6 + 6 * (idx / max(d - 1, 1)) ** (1 + ratio_0_to_1 ** 0.3)
        for mix, power in (("r", 0.2), ("w", 0.9), ("k", 0.7), ("v", 0.7), ("a", 0.9), ("g", 0.2)):
            getattr(attn, f"x_{mix}").copy_((1.0 - ddd ** (power * ratio_1_to_almost0)).view(1, 1, d))
        attn.k_a.fill_(1.02)
        attn.r_k.fill_(-0.04)
        attn.k_k.copy_(0.71 - linear * 0.1)
        w0 = www + 0.5 + zigzag * 2.5 if cfg.decay_offset_range is None else \
            torch.linspace(*cfg.decay_offset_range, n, dtype=torch.float64).repeat(cfg.num_heads)
        attn.w_lora.reset(w0)
        attn.a_lora.reset(-0.19 + zigzag * 0.3 + linear * 0.4)
        if hasattr(attn, "v_lora"):
            attn.v_lora.reset(0.73 - linear * 0.4)
        attn.g_lora.reset()
        attn.g_norm.weight.fill_(((i + 1) / layers) ** 0.7)
        attn.g_norm.bias.zero_()
        nn.init.orthogonal_(attn.r_proj.weight)
        nn.init.orthogonal_(attn.k_proj.weight, gain=0.1)
        nn.init.orthogonal_(attn.v_proj.weight)
        ffn.x_k.copy_(1.0 - ddd ** (ratio_1_to_almost0 ** 4))
        nn.init.orthogonal_(ffn.key.weight)
        for lin in self.residual_outputs(block):
            if cfg.zero_residual_init:
                nn.init.zeros_(lin.weight)
            else:
                nn.init.kaiming_uniform_(lin.weight, a=math.sqrt(5))
                lin.weight /= math.sqrt(2 * layers)


__all__ = ["RWKV7Attention", "RWKV7Block", "RWKV7LM"]
