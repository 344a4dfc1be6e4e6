"""RWKV-6 checkpoints in two formats.

fla-hub/rwkv6-*: config.json (fla's RWKV6Config) + model.safetensors under fla's names, which are the model's own
(reading, strict loading and writing are recurlen.models.official's).

BlinkDL's release format: one `.pth` file of named tensors (RWKV-x060-World-*.pth, what the `rwkv` pip package
loads), no config. Its shape is read off the weights; its names map onto fla's as below (BLINKDL_FILE). BlinkDL's
token-shift mixes are stored in the order w, k, v, r, g and fla's in r, w, k, v, g; its matrices as (out, in) like
nn.Linear, except the low-rank ones (time_maa_w1 / time_decay_w1 (D, R), time_decay_w2 (R, D), time_maa_w2
(5, R, D)), which are stored for `x @ W`. Anything else in the file (a tuned initial state `time_state`, another
RWKV version's keys) is refused by name.
"""

from __future__ import annotations

import torch

from recurlen.models.official import SAFETENSORS_NAME, OfficialFormat
from recurlen.models.rwkv6.config import RWKV6Config
from recurlen.models.rwkv_common import blinkdl_layers, blinkdl_read_keys, blinkdl_write_keys
from recurlen.models.weights_file import WeightsFileFormat
from recurlen.util.errors import UserError

RWKV6_FORMAT = OfficialFormat(weights=SAFETENSORS_NAME, embedding_key="model.embeddings.weight",
                              tie_flag="tie_word_embeddings", library="fla",
                              loading="import fla; from transformers import AutoModelForCausalLM; "
                                      "model = AutoModelForCausalLM.from_pretrained(DIR)")

BLINKDL_ORDER = ("w", "k", "v", "r", "g")
FLA_ORDER = ("r", "w", "k", "v", "g")
BLINKDL_GROUP_NORM_EPS = 64e-5
"""BlinkDL's ln_x: GroupNorm eps 1e-5 * head_size_divisor^2 with head_size_divisor 8."""

# BlinkDL name (after `blocks.{i}.`) -> fla name (after `model.layers.{i}.`), for tensors renamed and reshaped only.
_PLAIN = {
    "ln1.weight": "attn_norm.weight", "ln1.bias": "attn_norm.bias",
    "ln2.weight": "ffn_norm.weight", "ln2.bias": "ffn_norm.bias",
    "att.receptance.weight": "attn.r_proj.linear.weight", "att.key.weight": "attn.k_proj.linear.weight",
    "att.value.weight": "attn.v_proj.linear.weight", "att.gate.weight": "attn.g_proj.linear.weight",
    "att.output.weight": "attn.o_proj.weight", "att.ln_x.weight": "attn.g_norm.weight",
    "att.ln_x.bias": "attn.g_norm.bias", "att.time_faaaa": "attn.bonus",
    "att.time_maa_x": "attn.x_proj.0.mu", "att.time_decay": "attn.w_proj.linear.lora.2.bias",
    "att.time_decay_w1": "attn.w_proj.linear.lora.0.weight", "att.time_decay_w2": "attn.w_proj.linear.lora.2.weight",
    "ffn.time_maa_k": "ffn.key.mu", "ffn.time_maa_r": "ffn.receptance.mu", "ffn.key.weight": "ffn.key.linear.weight",
    "ffn.receptance.weight": "ffn.receptance.linear.weight", "ffn.value.weight": "ffn.value.weight",
}
_TRANSPOSED = {"att.time_decay_w1", "att.time_decay_w2"}
_MIXES = {f"att.time_maa_{b}" for b in BLINKDL_ORDER}
_LOW_RANK_MIX = {"att.time_maa_w1", "att.time_maa_w2"}


def blinkdl_recognises(tensors: dict[str, torch.Tensor]) -> bool:
    """RWKV-6 (Finch) keys: data-dependent token shift (time_maa_*) and the bonus (time_faaaa)."""
    return "emb.weight" in tensors and "blocks.0.att.time_maa_w1" in tensors and "blocks.0.att.time_faaaa" in tensors


def _config_from_shapes(t: dict[str, torch.Tensor], source: str) -> RWKV6Config:
    for key in ("emb.weight", "blocks.0.att.key.weight", "blocks.0.att.value.weight", "blocks.0.att.time_faaaa",
                "blocks.0.att.time_maa_w1", "blocks.0.att.time_decay_w1", "blocks.0.ffn.key.weight"):
        if key not in t:
            raise UserError(f"{source}: not an RWKV-6 (Finch) checkpoint: it has no {key!r}")
    vocab, hidden = t["emb.weight"].shape
    return RWKV6Config(hidden_size=hidden, num_hidden_layers=blinkdl_layers(t),
                       num_heads=t["blocks.0.att.time_faaaa"].shape[0],
                       expand_k=t["blocks.0.att.key.weight"].shape[0] / hidden,
                       expand_v=t["blocks.0.att.value.weight"].shape[0] / hidden,
                       intermediate_size=t["blocks.0.ffn.key.weight"].shape[0],
                       proj_low_rank_dim=t["blocks.0.att.time_maa_w1"].shape[1] // 5,
                       gate_low_rank_dim=t["blocks.0.att.time_decay_w1"].shape[1], vocab_size=vocab,
                       norm_eps=1e-5, head_norm_eps=BLINKDL_GROUP_NORM_EPS)


def blinkdl_read(t: dict[str, torch.Tensor], source: str) -> tuple[RWKV6Config, dict[str, torch.Tensor]]:
    """A BlinkDL RWKV-6 state dict -> (config, state dict under fla's names). Shapes are checked by the strict load
    that follows (recurlen.models.official.load_strict); unknown keys are refused here."""
    if not blinkdl_recognises(t):
        raise UserError(f"{source}: not an RWKV-6 (Finch) checkpoint (no blocks.0.att.time_maa_w1 / time_faaaa); "
                        "recurlen loads RWKV-6 only")
    cfg = _config_from_shapes(t, source)
    mixes: dict[int, dict[str, torch.Tensor]] = {}

    def block(i: int, rest: str, tensor: torch.Tensor) -> dict[str, torch.Tensor] | None:
        if rest in _PLAIN:
            value = tensor.t() if rest in _TRANSPOSED else tensor
            return {_PLAIN[rest]: value.reshape(-1) if value.dim() == 3 else value}  # (1, 1, D) -> (D,)
        if rest in _MIXES or rest in _LOW_RANK_MIX:
            mixes.setdefault(i, {})[rest] = tensor  # mapped below, once the block's five mixes are all read
            return {}
        return None

    out = blinkdl_read_keys(t, block, source=source, title="RWKV-6",
                            unsupported="a tuned time_state or another RWKV version's weights")
    rank = cfg.proj_low_rank_dim
    for i, parts in mixes.items():
        missing = sorted((_MIXES | _LOW_RANK_MIX) - set(parts))
        if missing:
            raise UserError(f"{source}: block {i} lacks {missing}")
        prefix = f"model.layers.{i}.attn."
        out[prefix + "x_bias"] = torch.stack([parts[f"att.time_maa_{b}"].reshape(-1) for b in FLA_ORDER])
        w1 = dict(zip(BLINKDL_ORDER, parts["att.time_maa_w1"].unflatten(1, (5, rank)).unbind(1)))  # each (D, R)
        out[prefix + "x_proj.0.linear.weight"] = torch.cat([w1[b] for b in FLA_ORDER], dim=1).t()
        w2 = dict(zip(BLINKDL_ORDER, parts["att.time_maa_w2"].unbind(0)))  # each (R, D)
        out[prefix + "x_proj.2.weight"] = torch.cat([w2[b] for b in FLA_ORDER], dim=0).t()
    return cfg, out


def blinkdl_write(model) -> dict[str, torch.Tensor]:
    """The model's weights as a BlinkDL RWKV-6 .pth state dict (what the `rwkv` package loads)."""
    cfg, sd = model.config, model.state_dict()
    rank = cfg.proj_low_rank_dim

    def block(_: int, prefix: str) -> dict[str, torch.Tensor]:
        out = {}
        for rest, fla in _PLAIN.items():
            value = sd[prefix + fla]
            value = value.t() if rest in _TRANSPOSED else value
            out[rest] = value.view(1, 1, -1) if rest in ("att.time_maa_x", "att.time_decay", "ffn.time_maa_k",
                                                          "ffn.time_maa_r") else value
        bias = dict(zip(FLA_ORDER, sd[prefix + "attn.x_bias"].unbind(0)))
        for b in BLINKDL_ORDER:
            out[f"att.time_maa_{b}"] = bias[b].view(1, 1, -1)
        w1 = dict(zip(FLA_ORDER, sd[prefix + "attn.x_proj.0.linear.weight"].t().split(rank, dim=1)))
        out["att.time_maa_w1"] = torch.cat([w1[b] for b in BLINKDL_ORDER], dim=1)
        w2 = dict(zip(FLA_ORDER, sd[prefix + "attn.x_proj.2.weight"].t().split(rank, dim=0)))
        out["att.time_maa_w2"] = torch.stack([w2[b] for b in BLINKDL_ORDER])
        return out

    return blinkdl_write_keys(sd, cfg.num_hidden_layers, block)


BLINKDL_FILE = WeightsFileFormat(suffix=".pth", description="BlinkDL's RWKV-6 .pth checkpoint", read=blinkdl_read,
                                 recognises=blinkdl_recognises, write=blinkdl_write)


__all__ = ["BLINKDL_FILE", "RWKV6_FORMAT", "blinkdl_read", "blinkdl_recognises", "blinkdl_write"]
