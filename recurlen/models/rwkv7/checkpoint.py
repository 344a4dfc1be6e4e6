"""RWKV-7 checkpoints in two formats.

fla-hub/rwkv7-*: config.json (fla's RWKV7Config) + model.safetensors under fla's names, which are the model's own
(reading, strict loading and writing are recurlen.models.official's).

BlinkDL's release format: one `.pth` file of named tensors (RWKV-x070-World-*.pth, what the `rwkv` pip package
loads with RWKV_V7_ON=1), no config. Its shape is read off the weights; its names map onto fla's as below
(BLINKDL_FILE). BlinkDL stores the linear layers as (out, in) like nn.Linear, the low-rank pairs w1 / a1 / v1 / g1
(D, R) and w2 / a2 / v2 / g2 (R, D) for `x @ W` (fla's LoRA holds them transposed, the w0 / a0 / v0 offsets as the
second linear's bias), the token-shift mixes and k_k / k_a / w0 / a0 / v0 as (1, 1, D). The first block's value
residual (v0 / v1 / v2) exists in some files but is never read (the first layer's value is v_first itself): it is
accepted and dropped. Anything else (a tuned initial state, DeepEmbed's s_emb / s1 / s2, another RWKV version's
keys) is refused by name.
"""

from __future__ import annotations

import torch

from recurlen.models.official import SAFETENSORS_NAME, OfficialFormat
from recurlen.models.rwkv7.config import RWKV7Config, refuse_decay_clamp
from recurlen.models.rwkv_common import blinkdl_layers, blinkdl_read_keys, blinkdl_write_keys
from recurlen.models.weights_file import WeightsFileFormat
from recurlen.util.errors import UserError

RWKV7_FORMAT = OfficialFormat(weights=SAFETENSORS_NAME, embedding_key="model.embeddings.weight",
                              tie_flag="tie_word_embeddings", library="fla",
                              loading="import fla; from transformers import AutoModelForCausalLM; "
                                      "model = AutoModelForCausalLM.from_pretrained(DIR)")

BLINKDL_GROUP_NORM_EPS = 64e-5
"""BlinkDL's ln_x: GroupNorm eps 64e-5 whatever the head size (fla: head_dim * 1e-5, the same for heads of 64)."""

# BlinkDL name (after `blocks.{i}.`) -> fla name (after `model.layers.{i}.`), renamed and reshaped to fla's shape.
_PLAIN = {
    "ln1.weight": "attn_norm.weight", "ln1.bias": "attn_norm.bias",
    "ln2.weight": "ffn_norm.weight", "ln2.bias": "ffn_norm.bias",
    **{f"att.x_{m}": f"attn.x_{m}" for m in "rwkvag"},
    "att.k_k": "attn.k_k", "att.k_a": "attn.k_a", "att.r_k": "attn.r_k",
    "att.receptance.weight": "attn.r_proj.weight", "att.key.weight": "attn.k_proj.weight",
    "att.value.weight": "attn.v_proj.weight", "att.output.weight": "attn.o_proj.weight",
    "att.ln_x.weight": "attn.g_norm.weight", "att.ln_x.bias": "attn.g_norm.bias",
    "ffn.x_k": "ffn.x_k", "ffn.key.weight": "ffn.key.weight", "ffn.value.weight": "ffn.value.weight",
}
# The low-rank pairs: BlinkDL's X1 (D, R), X2 (R, D), X0 (1, 1, D) -> fla's X_lora.lora.{0.weight, 2.weight, 2.bias}.
_LORAS = {"w": "w_lora", "a": "a_lora", "v": "v_lora", "g": "g_lora"}
_UNUSED_IN_FIRST = {"att.v0", "att.v1", "att.v2"}


def _lora_parts(i: int) -> dict[str, str]:
    """BlinkDL name -> fla name of block i's low-rank pairs (the first block has no value residual, g no offset)."""
    out = {}
    for x, lora in _LORAS.items():
        if x == "v" and i == 0:
            continue
        out[f"att.{x}1"] = f"attn.{lora}.lora.0.weight"
        out[f"att.{x}2"] = f"attn.{lora}.lora.2.weight"
        if x != "g":
            out[f"att.{x}0"] = f"attn.{lora}.lora.2.bias"
    return out


def blinkdl_recognises(tensors: dict[str, torch.Tensor]) -> bool:
    """RWKV-7 (x070) keys: the removal key's scale k_k and the bonus r_k."""
    return "emb.weight" in tensors and "blocks.0.att.k_k" in tensors and "blocks.0.att.r_k" in tensors


def _config_from_shapes(t: dict[str, torch.Tensor], source: str) -> RWKV7Config:
    for key in ("emb.weight", "blocks.0.att.r_k", "blocks.0.att.w1", "blocks.0.att.a1", "blocks.0.att.g1",
                "blocks.0.ffn.key.weight"):
        if key not in t:
            raise UserError(f"{source}: not an RWKV-7 (x070) checkpoint: it has no {key!r}")
    vocab, hidden = t["emb.weight"].shape
    v_rank = t["blocks.1.att.v1"].shape[1] if "blocks.1.att.v1" in t else 16  # one layer: no value residual
    return RWKV7Config(hidden_size=hidden, num_hidden_layers=blinkdl_layers(t), head_dim=t["blocks.0.att.r_k"].shape[1],
                       decay_low_rank_dim=t["blocks.0.att.w1"].shape[1], a_low_rank_dim=t["blocks.0.att.a1"].shape[1],
                       gate_low_rank_dim=t["blocks.0.att.g1"].shape[1], v_low_rank_dim=v_rank,
                       intermediate_size=t["blocks.0.ffn.key.weight"].shape[0], vocab_size=vocab, norm_eps=1e-5,
                       head_norm_eps=BLINKDL_GROUP_NORM_EPS)


def blinkdl_read(t: dict[str, torch.Tensor], source: str) -> tuple[RWKV7Config, dict[str, torch.Tensor]]:
    """A BlinkDL RWKV-7 state dict -> (config, state dict under fla's names). Shapes are checked by the strict load
    that follows (recurlen.models.official.load_strict); unknown keys are refused here."""
    if not blinkdl_recognises(t):
        raise UserError(f"{source}: not an RWKV-7 (x070) checkpoint (no blocks.0.att.k_k / r_k); recurlen loads "
                        "RWKV-7 only from this file")
    cfg = _config_from_shapes(t, source)
    loras = {i: _lora_parts(i) for i in range(cfg.num_hidden_layers)}

    def block(i: int, rest: str, tensor: torch.Tensor) -> dict[str, torch.Tensor] | None:
        if rest in _PLAIN:
            fla = _PLAIN[rest]
            # (1, 1, D) -> (D,) except the token-shift mixes, which fla keeps (1, 1, D)
            return {fla: tensor if fla.startswith("attn.x_") or tensor.dim() != 3 else tensor.reshape(-1)}
        if rest in loras[i]:
            return {loras[i][rest]: tensor.reshape(-1) if rest[-1] == "0" else tensor.t()}
        if i == 0 and rest in _UNUSED_IN_FIRST:
            return {}
        return None

    out = blinkdl_read_keys(t, block, source=source, title="RWKV-7",
                            unsupported="a tuned initial state, DeepEmbed or another RWKV version's weights")
    return cfg, out


def blinkdl_write(model) -> dict[str, torch.Tensor]:
    """The model's weights as a BlinkDL RWKV-7 .pth state dict (what the `rwkv` package loads)."""
    cfg, sd = model.config, model.state_dict()
    refuse_decay_clamp(cfg, "BlinkDL's RWKV-7 .pth")

    def block(i: int, prefix: str) -> dict[str, torch.Tensor]:
        out = {}
        for rest, fla in _PLAIN.items():
            value = sd[prefix + fla]
            out[rest] = value.view(1, 1, -1) if rest in ("att.k_k", "att.k_a", "ffn.x_k") else value
        for rest, fla in _lora_parts(i).items():
            value = sd[prefix + fla]
            out[rest] = value.view(1, 1, -1) if rest[-1] == "0" else value.t()
        return out

    return blinkdl_write_keys(sd, cfg.num_hidden_layers, block)


BLINKDL_FILE = WeightsFileFormat(suffix=".pth", description="BlinkDL's RWKV-7 .pth checkpoint", read=blinkdl_read,
                                 recognises=blinkdl_recognises, write=blinkdl_write)


__all__ = ["BLINKDL_FILE", "RWKV7_FORMAT", "blinkdl_read", "blinkdl_recognises", "blinkdl_write"]
