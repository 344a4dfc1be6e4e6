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

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from recurlen.config import BACKENDS
from recurlen.mamba1 import kernels
from recurlen.mamba1.config import Mamba1Config
from recurlen.mamba1.scan import selective_scan_chunked, selective_scan_step
from recurlen.mamba1.state import Mamba1State
from recurlen.model import RMSNorm, causal_conv, sample_A
from recurlen.ssd import up


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
        self.reset_ssm_parameters()

    @torch.no_grad()
    def reset_ssm_parameters(self) -> None:
        """mamba-ssm's Mamba-1 initialisation of dt_proj, A_log (S4D-real: A = -(1..N), or A_init_range) and D."""
        cfg = self.cfg
        std = cfg.dt_rank**-0.5 * cfg.dt_scale
        nn.init.uniform_(self.dt_proj.weight, -std, std)
        u = torch.rand(cfg.d_inner)
        dt = torch.exp(u * (math.log(cfg.dt_max) - math.log(cfg.dt_min)) + math.log(cfg.dt_min))
        dt = dt.clamp(min=cfg.dt_init_floor)
        self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse of softplus
        if cfg.A_init_range is None:
            self.A_log.copy_(torch.log(torch.arange(1, cfg.d_state + 1, dtype=torch.float32)).repeat(cfg.d_inner, 1))
        else:
            A = sample_A((cfg.d_inner, cfg.d_state), cfg.A_init_range, log_uniform=cfg.A_init_log_uniform)
            self.A_log.copy_(torch.log(A))
        self.D.fill_(1.0)

    def _ssm_inputs(self, x_BLI: torch.Tensor):
        """x -> (dt after softplus, B, C) through x_proj and dt_proj."""
        cfg = self.cfg
        dt_BLR, B_BLN, C_BLN = torch.split(self.x_proj(x_BLI), [cfg.dt_rank, cfg.d_state, cfg.d_state], dim=-1)
        # softplus(W dt + bias): the bias is dt_proj's, as in the kernel's delta_bias.
        return F.softplus(up(self.dt_proj(dt_BLR))), B_BLN, C_BLN

    def forward(self, u_BLD: torch.Tensor, ssm_state_BIN: torch.Tensor, conv_state_BIW: torch.Tensor, *,
                use_kernels: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        x_BLI, z_BLI = self.in_proj(u_BLD).chunk(2, dim=-1)
        conv_weight_IK = self.conv1d.weight.squeeze(1)
        conv_out = kernels.causal_conv(x_BLI, conv_weight_IK, self.conv1d.bias, conv_state_BIW) if use_kernels \
            else None
        if conv_out is None:
            x_BLI, conv_state_BIW = causal_conv(x_BLI, conv_weight_IK, self.conv1d.bias, conv_state_BIW)
            x_BLI = F.silu(x_BLI)
        else:
            x_BLI, conv_state_BIW = conv_out
        A_IN = -torch.exp(up(self.A_log))
        if use_kernels:
            dt_BLR, B_BLN, C_BLN = torch.split(self.x_proj(x_BLI), [cfg.dt_rank, cfg.d_state, cfg.d_state], dim=-1)
            y_BLI, ssm_state_BIN = kernels.selective_scan(
                x_BLI, F.linear(dt_BLR, self.dt_proj.weight), A_IN, B_BLN, C_BLN, D_I=self.D,
                dt_bias_I=self.dt_proj.bias, initial_state_BIN=ssm_state_BIN)
        else:
            dt_BLI, B_BLN, C_BLN = self._ssm_inputs(x_BLI)
            y_BLI, ssm_state_BIN = selective_scan_chunked(x_BLI, dt_BLI, A_IN, B_BLN, C_BLN, chunk_size=cfg.chunk_size,
                                                          initial_state_BDN=ssm_state_BIN)
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
        y_BI, ssm_state_BIN = selective_scan_step(x_BI, dt_BI, -torch.exp(up(self.A_log)), B_BN, C_BN,
                                                  up(ssm_state_BIN))
        y_BI = (y_BI + up(x_BI) * up(self.D)) * F.silu(up(z_BI))
        return self.out_proj(y_BI.to(u_BD.dtype)), ssm_state_BIN, up(conv_state_BIW)


class Block(nn.Module):
    """Pre-norm residual block; the residual stream is kept in float32 (residual_in_fp32)."""

    def __init__(self, cfg: Mamba1Config) -> None:
        super().__init__()
        self.residual_in_fp32 = cfg.residual_in_fp32
        self.norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.mixer = Mamba1Mixer(cfg)

    def _add(self, hidden: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        residual = hidden if residual is None else hidden + residual
        return up(residual) if self.residual_in_fp32 else residual


class Backbone(nn.Module):
    def __init__(self, cfg: Mamba1Config) -> None:
        super().__init__()
        self.embedding = nn.Embedding(cfg.padded_vocab_size, cfg.d_model)
        self.layers = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.norm_f = RMSNorm(cfg.d_model, eps=cfg.norm_eps)


class Mamba1LM(nn.Module):
    """Mamba-1 LM: embedding -> blocks -> norm_f -> (tied) LM head, with state in and out."""

    def __init__(self, config: Mamba1Config, *, backend: str = "auto") -> None:
        super().__init__()
        self.config = config
        self.backend = backend
        self.backbone = Backbone(config)
        self.lm_head = nn.Linear(config.d_model, config.padded_vocab_size, bias=False)
        self._init_weights()
        if config.tie_embeddings:
            self.lm_head.weight = self.backbone.embedding.weight

    @torch.no_grad()
    def _init_weights(self) -> None:
        """mamba-ssm's from-scratch init: N(0, 0.02) embedding, zero biases but dt's, out_proj scaled by 1/sqrt(K)."""
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
            kernels.require_kernels()
            if device.type != "cuda":
                raise ValueError(f"backend='kernel' needs the model on a CUDA device; it is on {device}")
            return True
        return device.type == "cuda" and kernels.kernels_available()

    def zero_state(self, batch: int, *, device: torch.device | str | None = None) -> Mamba1State:
        cfg = self.config
        device = self.backbone.embedding.weight.device if device is None else device
        return Mamba1State.zeros(n_layer=cfg.n_layer, batch=batch, d_inner=cfg.d_inner, d_state=cfg.d_state,
                                 d_conv=cfg.d_conv, device=device)

    def _check_state(self, state: Mamba1State | None, batch: int, device: torch.device) -> Mamba1State:
        want = self.zero_state(batch, device=device)
        if state is None:
            return want
        if not isinstance(state, Mamba1State):
            raise ValueError(f"state must be a Mamba1State or None; got {type(state).__name__}")
        state.check_like(want)
        return state

    @staticmethod
    def _check_ids(input_ids: torch.Tensor, ndim: int) -> None:
        if input_ids.dim() != ndim or input_ids.dtype not in (torch.int64, torch.int32):
            want = "(batch, length)" if ndim == 2 else "(batch,)"
            raise ValueError(f"input_ids must be an integer tensor of shape {want}; got "
                             f"{input_ids.dtype} {tuple(input_ids.shape)}")

    # ------------------------------------------------------------------ forward
    def forward_hidden(self, input_ids_BL: torch.Tensor, state: Mamba1State | None = None, *,
                       backend: str | None = None) -> tuple[torch.Tensor, Mamba1State]:
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
        return self.backbone.norm_f(residual), Mamba1State(torch.stack(ssm_out), torch.stack(conv_out))

    def logits_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        # Padded vocabulary rows are dropped from the weight (a contiguous view), never scored.
        return F.linear(hidden, self.lm_head.weight[: self.config.vocab_size])

    def forward(self, input_ids: torch.Tensor, state: Mamba1State | None = None, *,
                backend: str | None = None) -> tuple[torch.Tensor, Mamba1State]:
        """(batch, length) token ids [+ initial state] -> logits (batch, length, vocab), final state."""
        hidden, state = self.forward_hidden(input_ids, state, backend=backend)
        return self.logits_from_hidden(hidden), state

    @torch.no_grad()
    def step(self, input_ids_B: torch.Tensor, state: Mamba1State | None = None) -> tuple[torch.Tensor, Mamba1State]:
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
        return (self.logits_from_hidden(self.backbone.norm_f(residual)),
                Mamba1State(torch.stack(ssm_out), torch.stack(conv_out)))

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # ------------------------------------------------------------------ checkpoints
    @classmethod
    def from_pretrained(cls, path_or_hub_id: str, *, backend: str = "auto", device: str | torch.device | None = None,
                        dtype: torch.dtype = torch.float32) -> Mamba1LM:
        """Load an official-format directory (config.json + pytorch_model.bin) or a hub id from the cache."""
        from recurlen.mamba1.checkpoint import load_pretrained

        return load_pretrained(path_or_hub_id, backend=backend, device=device, dtype=dtype)

    def save_pretrained(self, directory: str, *, dtype: torch.dtype = torch.float32) -> None:
        """Write config.json + pytorch_model.bin in the official layout."""
        from recurlen.mamba1.checkpoint import save_pretrained

        save_pretrained(self, directory, dtype=dtype)


__all__ = ["Mamba1LM", "Mamba1Mixer"]
