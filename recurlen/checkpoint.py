"""Official-format checkpoints: a directory with config.json + pytorch_model.bin.

This is the layout of the state-spaces/mamba2-* repositories on the Hugging Face hub (weights in
fp16, `lm_head.weight` either stored next to the tied embedding or left out). Hub ids resolve
through the local Hugging Face cache first; a download happens only when the hub is reachable and
the cache lacks the files (never when HF_HUB_OFFLINE=1).
"""

from __future__ import annotations

import json
import logging
import os
import zipfile
from pathlib import Path

import torch
import torch.nn as nn

from recurlen.config import Mamba2Config
from recurlen.errors import UserError
from recurlen.files import save_torch, write_text

log = logging.getLogger(__name__)

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "pytorch_model.bin"
SAFETENSORS_NAME = "model.safetensors"
# recurlen's exact config (fields the official config.json cannot hold, e.g. A_init_log_uniform);
# kept in its own file so that mamba-ssm can still load a directory recurlen wrote.
RECURLEN_CONFIG_NAME = "recurlen_config.json"


def resolve_pretrained_dir(path_or_hub_id: str) -> Path:
    """A local directory as is; otherwise a hub id looked up in the HF cache (download only when online)."""
    path = Path(path_or_hub_id).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise ValueError(f"{path_or_hub_id!r} is a file; pass the checkpoint directory holding {CONFIG_NAME}")
    looks_like_hub_id = path_or_hub_id.count("/") == 1 and not path_or_hub_id.startswith((".", "/", "~"))
    if not looks_like_hub_id:
        raise FileNotFoundError(f"checkpoint directory {path_or_hub_id!r} does not exist")
    from huggingface_hub import snapshot_download

    patterns = [CONFIG_NAME, WEIGHTS_NAME, SAFETENSORS_NAME, "tokenizer*", "special_tokens_map.json", "vocab*",
                "merges.txt"]
    try:
        return Path(snapshot_download(path_or_hub_id, allow_patterns=patterns, local_files_only=True))
    except Exception as cache_err:  # not in the cache
        offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
        if offline:
            raise FileNotFoundError(
                f"{path_or_hub_id!r} is neither a local directory nor in the Hugging Face cache, and "
                "HF_HUB_OFFLINE=1 forbids downloading it"
            ) from cache_err
        try:
            return Path(snapshot_download(path_or_hub_id, allow_patterns=patterns))
        except Exception as err:
            raise FileNotFoundError(
                f"{path_or_hub_id!r} is neither a local directory nor in the Hugging Face cache, and downloading "
                f"it failed ({type(err).__name__}: {err})"
            ) from err


def read_config(directory: Path) -> Mamba2Config:
    own = directory / RECURLEN_CONFIG_NAME
    if own.is_file():
        return Mamba2Config.from_dict(json.loads(own.read_text()))
    config_path = directory / CONFIG_NAME
    if not config_path.is_file():
        raise FileNotFoundError(f"{directory} has no {CONFIG_NAME}")
    try:
        raw = json.loads(config_path.read_text())
    except json.JSONDecodeError as err:
        raise UserError(f"{config_path} is not valid JSON: {err}") from err
    return Mamba2Config.from_official_json(raw, source=str(config_path))


def load_error(path: str | os.PathLike, err: BaseException) -> UserError:
    """Why a weights file did not load, in one line that names it.

    torch's own messages run over many lines and, for a file weights_only refuses, advise weights_only=False,
    which would let the file run code: that advice is never passed on."""
    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError:
        size = None
    text = str(err).strip()
    if size == 0:
        why = "the file is empty"
    elif "Weights only load failed" in text and zipfile.is_zipfile(p):
        why = ("it holds something other than tensors and plain containers (damaged, or not a weights file); "
               "it was not loaded, as loading it could run code")
    elif "Weights only load failed" in text:
        why = "it is damaged, truncated or not a PyTorch weights file"
    else:
        first = text.splitlines()[0].split(". ")[0] if text else type(err).__name__
        why = f"it is damaged or truncated ({first})"
    return UserError(f"{p} cannot be loaded: {why}; write or download it again")


def read_state_dict(directory: Path) -> dict[str, torch.Tensor]:
    bin_path, st_path = directory / WEIGHTS_NAME, directory / SAFETENSORS_NAME
    if bin_path.is_file():
        # weights_only: a checkpoint from the internet must not run code when loaded.
        try:
            state = torch.load(bin_path, map_location="cpu", weights_only=True)
        except Exception as err:  # torch says little more than the pickle opcode it choked on
            raise load_error(bin_path, err) from err
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise UserError(f"{bin_path} is not a state dict (name -> tensor); write or download it again")
        return state
    if st_path.is_file():
        from safetensors.torch import load_file

        try:
            return load_file(str(st_path))
        except Exception as err:
            raise load_error(st_path, err) from err
    raise FileNotFoundError(f"{directory} has neither {WEIGHTS_NAME} nor {SAFETENSORS_NAME}")


def load_pretrained(cls: type[nn.Module], path_or_hub_id: str, *, backend: str, device,
                    dtype: torch.dtype) -> nn.Module:
    directory = resolve_pretrained_dir(path_or_hub_id)
    config = read_config(directory)
    state_dict = read_state_dict(directory)
    model = cls(config, backend=backend)
    load_official_state_dict(model, state_dict, source=str(directory))
    return model.to(device=device, dtype=dtype)


def load_official_state_dict(model: nn.Module, state_dict: dict[str, torch.Tensor], *, source: str) -> None:
    """Strict load with fp32 upcast; the tied head may be present or absent."""
    state_dict = dict(state_dict)
    head, emb = state_dict.get("lm_head.weight"), state_dict.get("backbone.embedding.weight")
    if model.config.tie_embeddings:
        if head is None and emb is not None:
            state_dict["lm_head.weight"] = emb
        elif head is not None and emb is not None and not torch.equal(head, emb):
            raise UserError(f"{source}: tie_embeddings is true but lm_head.weight differs from the embedding")
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    if missing or unexpected:
        raise UserError(f"{source}: checkpoint keys do not match the config; missing {missing[:8]}"
                         f"{'...' if len(missing) > 8 else ''}, unexpected {unexpected[:8]}"
                         f"{'...' if len(unexpected) > 8 else ''}")
    for name, tensor in state_dict.items():
        want = tuple(expected[name].shape)
        if tuple(tensor.shape) != want:
            raise UserError(f"{source}: {name} has shape {tuple(tensor.shape)}, the config needs {want}")
    model.load_state_dict({k: v.float() for k, v in state_dict.items()}, strict=True)


def save_pretrained(model: nn.Module, directory: str, *, dtype: torch.dtype = torch.float32) -> None:
    """Official layout; float32 by default so that a round trip is exact (pass float16 to match the hub)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    official = json.dumps(model.config.to_official_json(), indent=2)
    own = json.dumps(model.config.to_dict(), indent=2)
    write_text(out / CONFIG_NAME, official)
    write_text(out / RECURLEN_CONFIG_NAME, own)
    # The official files store both tied keys; clone so the two are separate storages in the file.
    state = {k: v.detach().to("cpu", dtype).clone() for k, v in model.state_dict().items()}
    save_torch(state, out / WEIGHTS_NAME)
