"""GLA checkpoints in the fla-hub/gla-* layout: config.json (fla's GLAConfig) + model.safetensors.

Loading is strict: every parameter of the configured model must be in the file with its shape, and
nothing else may be (a tied head may be stored or left out). Older fla releases named the embedding
`model.embed_tokens`; that one alias is accepted, nothing else is renamed.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from recurlen.checkpoint import (
    CONFIG_NAME,
    RECURLEN_CONFIG_NAME,
    SAFETENSORS_NAME,
    load_error,
    resolve_pretrained_dir,
)
from recurlen.files import atomic_write
from recurlen.gla.config import GLAConfig
from recurlen.gla.model import GLALM

OLD_EMBEDDING = "model.embed_tokens.weight"
EMBEDDING = "model.embeddings.weight"


def read_config(directory: Path) -> GLAConfig:
    own = directory / RECURLEN_CONFIG_NAME
    if own.is_file():
        return GLAConfig.from_dict(json.loads(own.read_text()))
    config_path = directory / CONFIG_NAME
    if not config_path.is_file():
        raise FileNotFoundError(f"{directory} has no {CONFIG_NAME}")
    try:
        raw = json.loads(config_path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{config_path} is not valid JSON: {err}") from err
    return GLAConfig.from_official_json(raw, source=str(config_path))


def read_state_dict(directory: Path) -> dict[str, torch.Tensor]:
    path = directory / SAFETENSORS_NAME
    if path.is_file():
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except Exception as err:
            raise load_error(path, err) from err
    bin_path = directory / "pytorch_model.bin"
    if bin_path.is_file():  # some fla exports
        try:
            return torch.load(bin_path, map_location="cpu", weights_only=True)
        except Exception as err:
            raise load_error(bin_path, err) from err
    raise FileNotFoundError(f"{directory} has neither {SAFETENSORS_NAME} nor pytorch_model.bin")


def load_state_dict_strict(model: GLALM, state_dict: dict[str, torch.Tensor], *, source: str) -> None:
    state_dict = dict(state_dict)
    if OLD_EMBEDDING in state_dict and EMBEDDING not in state_dict:
        state_dict[EMBEDDING] = state_dict.pop(OLD_EMBEDDING)
    if model.config.tie_word_embeddings:
        head, emb = state_dict.get("lm_head.weight"), state_dict.get(EMBEDDING)
        if head is None and emb is not None:
            state_dict["lm_head.weight"] = emb
        elif head is not None and emb is not None and not torch.equal(head, emb):
            raise ValueError(f"{source}: tie_word_embeddings is true but lm_head.weight differs from the embedding")
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{source}: checkpoint keys do not match the config; missing {missing[:8]}"
                         f"{'...' if len(missing) > 8 else ''}, unexpected {unexpected[:8]}"
                         f"{'...' if len(unexpected) > 8 else ''}")
    for name, tensor in state_dict.items():
        want = tuple(expected[name].shape)
        if tuple(tensor.shape) != want:
            raise ValueError(f"{source}: {name} has shape {tuple(tensor.shape)}, the config needs {want}")
    model.load_state_dict({k: v.float() for k, v in state_dict.items()}, strict=True)


def load_pretrained(path_or_hub_id: str, *, backend: str = "auto", device=None,
                    dtype: torch.dtype = torch.float32) -> GLALM:
    directory = resolve_pretrained_dir(path_or_hub_id)
    model = GLALM(read_config(directory), backend=backend)
    load_state_dict_strict(model, read_state_dict(directory), source=str(directory))
    return model.to(device=device, dtype=dtype)


def save_pretrained(model: GLALM, directory: str, *, dtype: torch.dtype = torch.float32) -> None:
    """fla's layout; float32 by default so that a round trip is exact."""
    from safetensors.torch import save_file

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    official = json.dumps(model.config.to_official_json(), indent=2)
    own = json.dumps(model.config.to_dict(), indent=2)
    atomic_write(out / CONFIG_NAME, lambda p: p.write_text(official))
    atomic_write(out / RECURLEN_CONFIG_NAME, lambda p: p.write_text(own))
    # safetensors refuses shared storage: a tied head is left out, as transformers does.
    state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in model.state_dict().items()
             if not (model.config.tie_word_embeddings and k == "lm_head.weight")}
    atomic_write(out / SAFETENSORS_NAME, lambda p: save_file(state, str(p), metadata={"format": "pt"}))


__all__ = ["load_pretrained", "load_state_dict_strict", "read_config", "save_pretrained"]
