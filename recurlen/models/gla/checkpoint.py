"""GLA checkpoints in the fla-hub/gla-* layout: config.json (fla's GLAConfig) + model.safetensors.

Reading, strict loading and writing are recurlen.models.official's; this is what differs for GLA: the file it
writes, its embedding key and tied-head flag, and the one old name it accepts (older fla releases named the
embedding `model.embed_tokens`; nothing else is renamed).
"""

from recurlen.models.official import SAFETENSORS_NAME, OfficialFormat

GLA_FORMAT = OfficialFormat(weights=SAFETENSORS_NAME, embedding_key="model.embeddings.weight",
                            tie_flag="tie_word_embeddings",
                            aliases={"model.embed_tokens.weight": "model.embeddings.weight"}, library="fla",
                            loading="import fla; from transformers import AutoModelForCausalLM; "
                                    "model = AutoModelForCausalLM.from_pretrained(DIR)")

__all__ = ["GLA_FORMAT"]
