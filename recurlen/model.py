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

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from recurlen import checkpoint, kernels
from recurlen.config import BACKENDS, Mamba2Config
from recurlen.ssd import ssd_chunked, ssd_step, up
from recurlen.state import RecurrentState


def sample_A(shape, A_init_range: tuple[float, float], *, log_uniform: bool) -> torch.Tensor:
    """Decay rates A (positive; the model uses -A) sampled in A_init_range, uniformly or log-uniformly (Mamba-2's
    heads and Mamba-1's A_init_range option share it)."""
    lo, hi = A_init_range
    if log_uniform:
        return torch.exp(torch.empty(shape).uniform_(math.log(lo), math.log(hi)))
    return torch.empty(shape).uniform_(lo, hi)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # F.rms_norm is one fused kernel (forward and backward) instead of five elementwise passes.
        return F.rms_norm(up(x), (x.shape[-1],), up(self.weight), self.eps).to(self.weight.dtype)


class GatedRMSNorm(nn.Module):
    """rmsnorm(y * silu(z)) per group of d_inner/ngroups channels, times weight (norm_before_gate=False)."""

    def __init__(self, dim: int, group_size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.group_size = group_size
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        g = up(y) * F.silu(up(z))
        # F.rms_norm is one fused kernel; it normalizes the trailing group and takes a weight of
        # that shape, so with one group the weight goes in, with several it is applied after.
        if self.group_size == g.shape[-1]:
            return F.rms_norm(g, (self.group_size,), up(self.weight), self.eps).to(y.dtype)
        g_grouped = F.rms_norm(g.unflatten(-1, (-1, self.group_size)), (self.group_size,), None, self.eps)
        return (g_grouped.flatten(-2) * up(self.weight)).to(y.dtype)


class _ShiftConv(torch.autograd.Function):
    """out[t] = sum_k weight[k] * x_pad[t + k] (+ bias), depthwise, as d_conv shifted multiply-adds.

    F.conv1d(groups=C) is slow on CPU, and autograd through d_conv slices of x_pad zero-fills a
    padded-size gradient per slice; the backward here is the same shift-adds, run in place.
    """

    @staticmethod
    def forward(ctx, x_pad_BLC: torch.Tensor, weight_KC: torch.Tensor, bias_C: torch.Tensor | None) -> torch.Tensor:
        width = weight_KC.shape[0]
        length = x_pad_BLC.shape[1] - width + 1
        out_BLC = x_pad_BLC[:, 0:length] * weight_KC[0]
        for k in range(1, width):
            out_BLC.addcmul_(x_pad_BLC[:, k:k + length], weight_KC[k])
        if bias_C is not None:
            out_BLC += bias_C
        ctx.save_for_backward(x_pad_BLC, weight_KC)
        ctx.has_bias = bias_C is not None
        return out_BLC

    @staticmethod
    def backward(ctx, grad_BLC: torch.Tensor):
        x_pad_BLC, weight_KC = ctx.saved_tensors
        width, length = weight_KC.shape[0], grad_BLC.shape[1]
        grad_x_pad = torch.zeros_like(x_pad_BLC)
        grad_weight = torch.empty_like(weight_KC)
        for k in range(width):
            grad_x_pad[:, k:k + length].addcmul_(grad_BLC, weight_KC[k])
            grad_weight[k] = (grad_BLC * x_pad_BLC[:, k:k + length]).sum((0, 1))
        return grad_x_pad, grad_weight, grad_BLC.sum((0, 1)) if ctx.has_bias else None


def causal_conv(xBC_BLC: torch.Tensor, weight_CK: torch.Tensor, bias_C: torch.Tensor | None,
                conv_state_BCW: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv continuing from the last W inputs (carrying the window is a concat)."""
    width = weight_CK.shape[1]
    x_pad_BLC = torch.cat([conv_state_BCW.transpose(1, 2).to(xBC_BLC.dtype), xBC_BLC], dim=1)
    # weight_CK[:, k] is a strided column: contiguous taps make every multiply ~2x faster.
    out_BLC = _ShiftConv.apply(x_pad_BLC, weight_CK.t().contiguous(), bias_C)
    return out_BLC, x_pad_BLC[:, -(width - 1):].transpose(1, 2)


# The scan's result does not depend on the chunk length, only its cost does: inside a chunk the work is
# (chunk x chunk) elementwise passes per head, which are memory-bound on a CPU. At the official shapes
# (chunk 256) chunks of 64 make a 130m training step ~10% faster on CPU; GPUs keep the configured one.
CPU_MAX_CHUNK = 64


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
        self.reset_ssm_parameters()

    @torch.no_grad()
    def reset_ssm_parameters(self) -> None:
        """mamba-ssm's initialisation of dt_bias, A_log and D (for training from scratch)."""
        cfg = self.cfg
        u = torch.rand(cfg.nheads)
        dt = torch.exp(u * (math.log(cfg.dt_max) - math.log(cfg.dt_min)) + math.log(cfg.dt_min))
        dt = dt.clamp(min=cfg.dt_init_floor)
        self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse of softplus
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
                use_kernels: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        batch, length, _ = u_BLD.shape
        z_BLI, xBC_BLC, dt_BLH = self._split(self.in_proj(u_BLD))
        conv_weight_CK = self.conv1d.weight.squeeze(1)

        conv_out = kernels.causal_conv_kernel(xBC_BLC, conv_weight_CK, self.conv1d.bias, conv_state_BCW) \
            if use_kernels else None
        if conv_out is None:
            xBC_BLC, conv_state_BCW = causal_conv(xBC_BLC, conv_weight_CK, self.conv1d.bias, conv_state_BCW)
            xBC_BLC = F.silu(xBC_BLC)
        else:
            xBC_BLC, conv_state_BCW = conv_out
        x_BLI, B_BLGN, C_BLGN = self._split_xBC(xBC_BLC)
        x_BLHP = x_BLI.unflatten(-1, (cfg.nheads, cfg.headdim))
        B_BLGN = B_BLGN.unflatten(-1, (cfg.ngroups, cfg.d_state))
        C_BLGN = C_BLGN.unflatten(-1, (cfg.ngroups, cfg.d_state))
        A_H = -torch.exp(up(self.A_log))

        if use_kernels:
            y_BLHP, ssm_state_BHPN = kernels.ssd_kernel(
                x_BLHP, dt_BLH, A_H, B_BLGN, C_BLGN, chunk_size=cfg.chunk_size, D_H=self.D,
                dt_bias_H=self.dt_bias, dt_limit=cfg.dt_limit, initial_state_BHPN=ssm_state_BHPN)
            y_BLI = y_BLHP.flatten(-2)
            y_BLI = kernels.gated_rmsnorm_kernel(y_BLI, z_BLI, self.norm.weight, eps=cfg.norm_eps,
                                                 group_size=cfg.d_inner // cfg.ngroups)
        else:
            dt_BLH = self._dt(dt_BLH)
            y_BLHP, ssm_state_BHPN = ssd_chunked(x_BLHP, dt_BLH, A_H, B_BLGN, C_BLGN,
                                                 chunk_size=torch_chunk_size(cfg.chunk_size, x_BLHP.device),
                                                 initial_state_BHPN=ssm_state_BHPN)
            y_BLHP = torch.addcmul(y_BLHP, up(x_BLHP), up(self.D)[:, None])
            y_BLI = self.norm(y_BLHP.flatten(-2).to(u_BLD.dtype), z_BLI)
        return self.out_proj(y_BLI), ssm_state_BHPN, up(conv_state_BCW)

    def _dt(self, dt_raw: torch.Tensor) -> torch.Tensor:
        dt = F.softplus(up(dt_raw) + up(self.dt_bias))
        lo, hi = self.cfg.dt_limit
        if lo > 0.0 or hi < float("inf"):
            dt = dt.clamp(min=lo, max=hi)
        return dt

    def step(self, u_BD: torch.Tensor, ssm_state_BHPN: torch.Tensor, conv_state_BCW: torch.Tensor):
        """One token: the same math as forward with L = 1, without the chunk machinery."""
        cfg = self.cfg
        z_BI, xBC_BC, dt_BH = self._split(self.in_proj(u_BD))
        xBC_B1C, conv_state_BCW = causal_conv(xBC_BC.unsqueeze(1), self.conv1d.weight.squeeze(1),
                                              self.conv1d.bias, conv_state_BCW)
        x_BI, B_BG, C_BG = self._split_xBC(F.silu(xBC_B1C.squeeze(1)))
        x_BHP = x_BI.unflatten(-1, (cfg.nheads, cfg.headdim))
        y_BHP, ssm_state_BHPN = ssd_step(
            x_BHP, self._dt(dt_BH), -torch.exp(up(self.A_log)),
            B_BG.unflatten(-1, (cfg.ngroups, cfg.d_state)), C_BG.unflatten(-1, (cfg.ngroups, cfg.d_state)),
            up(ssm_state_BHPN))
        y_BHP = y_BHP + up(x_BHP) * up(self.D)[:, None]
        y_BI = self.norm(y_BHP.flatten(-2).to(u_BD.dtype), z_BI)
        return self.out_proj(y_BI), ssm_state_BHPN, up(conv_state_BCW)


class Block(nn.Module):
    """Pre-norm residual block; the residual stream is kept in float32 (residual_in_fp32)."""

    def __init__(self, cfg: Mamba2Config) -> None:
        super().__init__()
        self.residual_in_fp32 = cfg.residual_in_fp32
        self.norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.mixer = Mamba2Mixer(cfg)

    def _add(self, hidden: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        residual = hidden if residual is None else hidden + residual
        return up(residual) if self.residual_in_fp32 else residual


class Backbone(nn.Module):
    def __init__(self, cfg: Mamba2Config) -> None:
        super().__init__()
        self.embedding = nn.Embedding(cfg.padded_vocab_size, cfg.d_model)
        self.layers = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.norm_f = RMSNorm(cfg.d_model, eps=cfg.norm_eps)


class Mamba2LM(nn.Module):
    """Mamba-2 LM: embedding -> blocks -> norm_f -> (tied) LM head, with state in and out."""

    def __init__(self, config: Mamba2Config, *, backend: str = "auto") -> None:
        super().__init__()
        self.config = config
        self.backend = backend
        self.backbone = Backbone(config)
        self.lm_head = nn.Linear(config.d_model, config.padded_vocab_size, bias=False)
        self.score_padded_vocab = False
        """True: logits over the whole padded head, normalised as the official mamba_ssm models do (50288 rows
        for the Pile models); False (default): only the vocab_size real rows."""
        self._init_weights()
        if config.tie_embeddings:
            self.lm_head.weight = self.backbone.embedding.weight

    # ------------------------------------------------------------------ setup
    @torch.no_grad()
    def _init_weights(self) -> None:
        """mamba-ssm's from-scratch init: N(0, 0.02) embedding, zero biases, out_proj scaled by 1/sqrt(K)."""
        cfg = self.config
        nn.init.normal_(self.backbone.embedding.weight, std=cfg.initializer_range)
        for block in self.backbone.layers:
            mixer = block.mixer
            for lin in (mixer.in_proj, mixer.out_proj):
                if lin.bias is not None:
                    nn.init.zeros_(lin.bias)
            nn.init.kaiming_uniform_(mixer.out_proj.weight, a=math.sqrt(5))
            mixer.out_proj.weight /= math.sqrt(cfg.n_layer)

    @property
    def backend(self) -> str:
        return self._backend

    @backend.setter
    def backend(self, value: str) -> None:
        if value not in BACKENDS:
            raise ValueError(f"unknown backend {value!r}; allowed: {list(BACKENDS)}")
        self._backend = value

    def _use_kernels(self, device: torch.device, backend: str | None) -> bool:
        backend = self.backend if backend is None else backend
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; allowed: {list(BACKENDS)}")
        if backend == "torch":
            return False
        if backend == "kernel":
            kernels.require_kernels(device)
            return True
        return kernels.auto_uses_kernels(device)

    def zero_state(self, batch: int, *, device: torch.device | str | None = None) -> RecurrentState:
        cfg = self.config
        device = self.backbone.embedding.weight.device if device is None else device
        return RecurrentState.zeros(n_layer=cfg.n_layer, batch=batch, nheads=cfg.nheads, headdim=cfg.headdim,
                                    d_state=cfg.d_state, conv_dim=cfg.conv_dim, d_conv=cfg.d_conv, device=device)

    def _check_state(self, state: RecurrentState | None, batch: int, device: torch.device) -> RecurrentState:
        if state is None:
            return self.zero_state(batch, device=device)
        if not isinstance(state, RecurrentState):
            raise ValueError(f"state must be a recurlen.RecurrentState or None; got {type(state).__name__}")
        cfg = self.config
        state.check_compatible(n_layer=cfg.n_layer, batch=batch, nheads=cfg.nheads, headdim=cfg.headdim,
                               d_state=cfg.d_state, conv_dim=cfg.conv_dim, d_conv=cfg.d_conv, device=device)
        return state

    def _check_ids(self, input_ids: torch.Tensor, ndim: int) -> None:
        if input_ids.dim() != ndim or input_ids.dtype not in (torch.int64, torch.int32):
            want = "(batch, length)" if ndim == 2 else "(batch,)"
            raise ValueError(f"input_ids must be an integer tensor of shape {want}; got "
                             f"{input_ids.dtype} {tuple(input_ids.shape)}")

    # ------------------------------------------------------------------ forward
    def forward_hidden(self, input_ids_BL: torch.Tensor, state: RecurrentState | None = None, *,
                       backend: str | None = None) -> tuple[torch.Tensor, RecurrentState]:
        """Final hidden states (after norm_f) and the final recurrent state."""
        self._check_ids(input_ids_BL, 2)
        batch, length = input_ids_BL.shape
        if length == 0:
            raise ValueError("input_ids has length 0; need at least one token")
        device = input_ids_BL.device
        state = self._check_state(state, batch, device)
        use_kernels = self._use_kernels(device, backend)
        hidden = self.backbone.embedding(input_ids_BL)
        residual = None
        ssm_out, conv_out = [], []
        for i, block in enumerate(self.backbone.layers):
            residual = block._add(hidden, residual)
            hidden, ssm_i, conv_i = block.mixer(block.norm(residual), state.ssm[i], state.conv[i],
                                                use_kernels=use_kernels)
            ssm_out.append(ssm_i)
            conv_out.append(conv_i)
        residual = self.backbone.layers[-1]._add(hidden, residual)
        hidden = self.backbone.norm_f(residual)
        return hidden, RecurrentState.stack_layers(ssm_out, conv_out)

    def logits_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        # Rows past vocab_size are padding and never targets. Dropping them from the weight (a contiguous
        # view of its first rows) rather than from the logits keeps the logits contiguous, and the
        # backward's zero-filled buffer the size of the weight, not of (tokens x vocab).
        if self.score_padded_vocab:
            return F.linear(hidden, self.lm_head.weight)
        return F.linear(hidden, self.lm_head.weight[: self.config.vocab_size])

    def forward(self, input_ids: torch.Tensor, state: RecurrentState | None = None, *,
                backend: str | None = None) -> tuple[torch.Tensor, RecurrentState]:
        """(batch, length) token ids [+ initial state] -> logits (batch, length, vocab), final state."""
        hidden, state = self.forward_hidden(input_ids, state, backend=backend)
        return self.logits_from_hidden(hidden), state

    @torch.no_grad()
    def step(self, input_ids_B: torch.Tensor,
             state: RecurrentState | None = None) -> tuple[torch.Tensor, RecurrentState]:
        """One token per row: (batch,) ids -> logits (batch, vocab), next state. For generation."""
        self._check_ids(input_ids_B, 1)
        state = self._check_state(state, input_ids_B.shape[0], input_ids_B.device)
        hidden = self.backbone.embedding(input_ids_B)
        residual = None
        ssm_out, conv_out = [], []
        for i, block in enumerate(self.backbone.layers):
            residual = block._add(hidden, residual)
            hidden, ssm_i, conv_i = block.mixer.step(block.norm(residual), state.ssm[i], state.conv[i])
            ssm_out.append(ssm_i)
            conv_out.append(conv_i)
        residual = self.backbone.layers[-1]._add(hidden, residual)
        return self.logits_from_hidden(self.backbone.norm_f(residual)), RecurrentState.stack_layers(ssm_out, conv_out)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # ------------------------------------------------------------------ checkpoints
    @classmethod
    def from_pretrained(cls, path_or_hub_id: str, *, backend: str = "auto", device: str | torch.device | None = None,
                        dtype: torch.dtype = torch.float32) -> Mamba2LM:
        """Load an official-format directory (config.json + pytorch_model.bin) or a hub id from the cache."""
        return checkpoint.load_pretrained(cls, path_or_hub_id, backend=backend, device=device, dtype=dtype)

    def save_pretrained(self, directory: str, *, dtype: torch.dtype = torch.float32) -> None:
        """Write config.json + pytorch_model.bin in the official layout."""
        checkpoint.save_pretrained(self, directory, dtype=dtype)
