"""Mamba-2 in transformers' format: Mamba2ForCausalLM's config.json (Mamba2Config) and parameter names.

The parameters are mamba-ssm's but for the embedding (`backbone.embeddings`), and transformers' Mamba-2 mixer is
the same math as recurlen's (gated RMSNorm after the gate, norm_before_gate=False, per group of d_inner / n_groups
channels), so a model round-trips with the same logits. The fields shared with Mamba-1 are
recurlen.models.mixer_model's; these are Mamba-2's, with Mamba2Config's defaults.
"""

from math import inf

from recurlen.models.mixer_model import mixer_model_transformers_format
from recurlen.models.transformers_format import Field

TRANSFORMERS_FORMAT = mixer_model_transformers_format(model_type="mamba2", class_name="Mamba2ForCausalLM", fields=(
    Field("hidden_size", "d_model", 4096), Field("num_hidden_layers", "n_layer", 64),
    Field("vocab_size", "padded_vocab_size", 32768, read_into="vocab_size"), Field("state_size", "d_state", 128),
    Field("head_dim", "headdim", 64), Field("n_groups", "ngroups", 8), Field("num_heads", "nheads", 128),
    Field("chunk_size", "chunk_size", 256), Field("time_step_limit", "dt_limit", (0.0, inf)),
    Field("tie_word_embeddings", "tie_embeddings", False)))

__all__ = ["TRANSFORMERS_FORMAT"]
