"""Hub ids and local directories: where a checkpoint or tokenizer named on the command line lives.

A local directory is used as it is. A hub id (`owner/name`) resolves through the local Hugging Face cache
first; a download happens only when the hub is reachable and the cache lacks the files (never when
HF_HUB_OFFLINE=1). A file inside a hub repository (`owner/name/file`: one of several models' weights files, as a
model-table row with a hub_file names it) resolves the same way, that file alone.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from recurlen.util.errors import UserError

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

    return _cache_first(lambda local: snapshot_download(path_or_hub_id, allow_patterns=HUB_PATTERNS,
                                                        local_files_only=local), path_or_hub_id)


def _cache_first(fetch: Callable[[bool], str], hub_id: str, filename: str | None = None, prefix: str = "") -> Path:
    """fetch(local_files_only) from the local HF cache; when it is not there, downloaded unless HF_HUB_OFFLINE=1.
    Either failure is `not_cached`'s one line (after `prefix`)."""
    try:
        return Path(fetch(True))
    except Exception as cache_err:  # not in the cache
        if offline():
            err = not_cached(hub_id, "HF_HUB_OFFLINE=1 is set, so it is not downloaded", filename)
            raise UserError(prefix + str(err)) from cache_err
        try:
            return Path(fetch(False))
        except Exception as download_err:
            first = (str(download_err).strip().splitlines() or [type(download_err).__name__])[0][:200]
            err = not_cached(hub_id, f"downloading it failed ({type(download_err).__name__}: {first})", filename)
            raise UserError(prefix + str(err)) from download_err


def hub_file_parts(spec: str) -> tuple[str, str] | None:
    """('owner/name', 'file') for `owner/name/file` that is no local path; None for anything else. The file must
    have a suffix (a weights file: `.pth`, `.safetensors`, ...), so that a mistyped run directory `a/b/run` stays a
    local path that does not exist rather than a hub lookup."""
    parts = spec.split("/")
    if len(parts) != 3 or not all(parts) or spec.startswith((".", "~")) or Path(spec).expanduser().exists() \
            or Path(parts[0]).expanduser().is_dir() or not Path(parts[2]).suffix:
        return None
    return f"{parts[0]}/{parts[1]}", parts[2]


def resolve_hub_file(spec: str) -> Path | None:
    """A file inside a hub repository (`owner/name/file`) from the local HF cache (downloaded only when online);
    None when `spec` is not of that form (a local path or a hub id: the caller takes it as it is)."""
    parts = hub_file_parts(spec)
    if parts is None:
        return None
    from huggingface_hub import hf_hub_download

    repo_id, filename = parts
    # Also a mistyped local path has this form: the error says both readings.
    local = f"checkpoint {spec!r} does not exist (no such file or directory here); read as a file of a hub repository, "
    return _cache_first(lambda local_only: hf_hub_download(repo_id, filename, local_files_only=local_only), repo_id,
                        filename, prefix=local)


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").strip().lower() in ("1", "true", "yes", "on")


def not_cached(hub_id: str, why: str, filename: str | None = None) -> UserError:
    """A hub id missing from the local cache, with where the cache is and how to fill it (compute nodes are often
    offline: the files are fetched on a machine with network, into the cache this one reads)."""
    from huggingface_hub import constants

    home = os.environ.get("HF_HOME") or str(Path(constants.HF_HUB_CACHE).parent)
    what, args = (hub_id, hub_id) if filename is None else (f"{hub_id}/{filename}", f"{hub_id} {filename}")
    return UserError(f"{what!r} is not in the local Hugging Face cache ({constants.HF_HUB_CACHE}) and {why}; on a "
                     f"machine with network run `HF_HOME={home} hf download {args}` (older huggingface_hub: "
                     f"huggingface-cli download), so that it lands in that cache (HF_HOME) or in a copy of it you "
                     "point HF_HOME at here; then rerun (with HF_HUB_OFFLINE=1 no download is tried)")


__all__ = ["HUB_PATTERNS", "hub_file_parts", "not_cached", "offline", "resolve_hub_file", "resolve_pretrained_dir"]
