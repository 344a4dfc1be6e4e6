"""Gated DeltaNet checkpoints in fla's layout: config.json (fla's GatedDeltaNetConfig) + model.safetensors.

Reading, strict loading and writing are recurlen.models.official's; this is what differs: the file it writes,
its embedding key and tied-head flag, and how fla loads such a directory.
"""

from recurlen.models.official import SAFETENSORS_NAME, OfficialFormat

GATED_DELTANET_FORMAT = OfficialFormat(
    weights=SAFETENSORS_NAME, embedding_key="model.embeddings.weight", tie_flag="tie_word_embeddings", library="fla",
    loading="import fla; from transformers import AutoModelForCausalLM; "
            "model = AutoModelForCausalLM.from_pretrained(DIR)")

__all__ = ["GATED_DELTANET_FORMAT"]
