"""Hub ids and local directories: where a checkpoint or tokenizer named on the command line lives.

A local directory is used as it is. A hub id (`owner/name`) resolves through the local Hugging Face cache
first; a download happens only when the hub is reachable and the cache lacks the files (never when
HF_HUB_OFFLINE=1).
"""

from __future__ import annotations

import os
from pathlib import Path

# The files a checkpoint directory may hold (weights in either format, the config, the tokenizer's files).
HUB_PATTERNS = ["config.json", "pytorch_model.bin", "model.safetensors", "tokenizer*", "special_tokens_map.json",
                "vocab*", "merges.txt"]


def resolve_pretrained_dir(path_or_hub_id: str) -> Path:
    """A local directory as is; otherwise a hub id looked up in the HF cache (download only when online)."""
    path = Path(path_or_hub_id).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise ValueError(f"{path_or_hub_id!r} is a file; pass the checkpoint directory holding config.json")
    looks_like_hub_id = path_or_hub_id.count("/") == 1 and not path_or_hub_id.startswith((".", "/", "~"))
    if not looks_like_hub_id:
        raise FileNotFoundError(f"checkpoint directory {path_or_hub_id!r} does not exist")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(path_or_hub_id, allow_patterns=HUB_PATTERNS, local_files_only=True))
    except Exception as cache_err:  # not in the cache
        offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
        if offline:
            raise FileNotFoundError(
                f"{path_or_hub_id!r} is neither a local directory nor in the Hugging Face cache, and "
                "HF_HUB_OFFLINE=1 forbids downloading it"
            ) from cache_err
        try:
            return Path(snapshot_download(path_or_hub_id, allow_patterns=HUB_PATTERNS))
        except Exception as err:
            raise FileNotFoundError(
                f"{path_or_hub_id!r} is neither a local directory nor in the Hugging Face cache, and downloading "
                f"it failed ({type(err).__name__}: {err})"
            ) from err


__all__ = ["HUB_PATTERNS", "resolve_pretrained_dir"]
