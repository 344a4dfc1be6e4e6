"""Mamba-1 in transformers' format: MambaForCausalLM's config.json (MambaConfig) and parameter names.

The parameters are mamba-ssm's but for the embedding (`backbone.embeddings`). The fields shared with Mamba-2 are
recurlen.models.mixer_model's; these are Mamba-1's, with MambaConfig's defaults.
"""

from recurlen.models.mixer_model import mixer_model_transformers_format
from recurlen.models.transformers_format import Field

TRANSFORMERS_FORMAT = mixer_model_transformers_format(model_type="mamba", class_name="MambaForCausalLM", fields=(
    Field("hidden_size", "d_model", 768), Field("num_hidden_layers", "n_layer", 32),
    Field("vocab_size", "padded_vocab_size", 50280, read_into="vocab_size"), Field("state_size", "d_state", 16),
    Field("time_step_rank", "dt_rank", "auto"), Field("time_step_scale", "dt_scale", 1.0),
    Field("tie_word_embeddings", "tie_embeddings", True)))

__all__ = ["TRANSFORMERS_FORMAT"]
