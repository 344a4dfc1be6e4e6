"""Official-format checkpoints of every architecture: a directory with config.json and the weights.

An architecture declares its format (`OfficialFormat`: which weights file it writes, its embedding key and
tied-head flag, old key names it accepts); reading, strict loading and writing are written once, here. Loading
is strict: missing, unexpected or mis-shaped keys name themselves in a one-line error.

Next to config.json recurlen writes recurlen_config.json, its exact config (fields the official config.json
cannot hold, e.g. A_init_log_uniform), in its own file so that the reference library still loads the directory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from recurlen.util.atomic_files import save_torch, write_text
from recurlen.util.errors import UserError, load_error

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "pytorch_model.bin"
SAFETENSORS_NAME = "model.safetensors"
RECURLEN_CONFIG_NAME = "recurlen_config.json"


@dataclass(frozen=True)
class OfficialFormat:
    weights: str
    """The weights file written (pytorch_model.bin or model.safetensors); reading takes either, this one first."""
    embedding_key: str
    """The embedding's key: a tied head may be stored next to it (equal) or left out."""
    tie_flag: str
    """The config field that says the head is tied to the embedding."""
    aliases: dict[str, str] = field(default_factory=dict)
    """Old key -> current key, accepted when reading (an older release's name)."""


def _read_json(path: Path) -> dict[str, Any]:
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise UserError(f"{path} is not valid JSON: {err}") from err
    except UnicodeDecodeError as err:
        raise UserError(f"{path} is not a text file ({err.reason}); write or download it again") from err
    if not isinstance(raw, dict):
        raise UserError(f"{path} must hold a JSON object; got {type(raw).__name__}")
    return raw


def read_official_json(directory: Path) -> dict[str, Any]:
    path = Path(directory) / CONFIG_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{directory} has no {CONFIG_NAME}")
    return _read_json(path)


def read_config(directory: Path, config_cls: type) -> Any:
    """recurlen's exact config if the directory has one, else the official config.json mapped onto config_cls."""
    own = Path(directory) / RECURLEN_CONFIG_NAME
    if own.is_file():
        return config_cls.from_dict(_read_json(own))
    return config_cls.from_official_json(read_official_json(directory), source=str(Path(directory) / CONFIG_NAME))


def read_state_dict(directory: Path, fmt: OfficialFormat) -> dict[str, torch.Tensor]:
    """The weights in either format (the architecture's own first); never runs code from the file."""
    names = [fmt.weights, *(n for n in (WEIGHTS_NAME, SAFETENSORS_NAME) if n != fmt.weights)]
    for name in names:
        path = Path(directory) / name
        if not path.is_file():
            continue
        if name == SAFETENSORS_NAME:
            from safetensors.torch import load_file

            try:
                return load_file(str(path))
            except Exception as err:
                raise load_error(path, err) from err
        # weights_only: a checkpoint from the internet must not run code when loaded.
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # torch says little more than the pickle opcode it choked on
            raise load_error(path, err) from err
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise UserError(f"{path} is not a state dict (name -> tensor); write or download it again")
        return state
    raise FileNotFoundError(f"{directory} has neither {names[0]} nor {names[1]}")


def load_strict(model: nn.Module, state_dict: dict[str, torch.Tensor], fmt: OfficialFormat, *, source: str) -> None:
    """Strict load with fp32 upcast; the tied head may be present or absent; `fmt.aliases` renamed."""
    state_dict = dict(state_dict)
    for old, new in fmt.aliases.items():
        if old in state_dict and new not in state_dict:
            state_dict[new] = state_dict.pop(old)
    if getattr(model.config, fmt.tie_flag):
        head, emb = state_dict.get("lm_head.weight"), state_dict.get(fmt.embedding_key)
        if head is None and emb is not None:
            state_dict["lm_head.weight"] = emb
        elif head is not None and emb is not None and not torch.equal(head, emb):
            raise UserError(f"{source}: {fmt.tie_flag} is true but lm_head.weight differs from the embedding")
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


def save(model: nn.Module, directory: str | Path, fmt: OfficialFormat, *, dtype: torch.dtype = torch.float32) -> None:
    """The official layout; float32 by default so that a round trip is exact (pass float16 to match the hub)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / CONFIG_NAME, json.dumps(model.config.to_official_json(), indent=2))
    write_text(out / RECURLEN_CONFIG_NAME, json.dumps(model.config.to_dict(), indent=2))
    if fmt.weights == SAFETENSORS_NAME:
        from safetensors.torch import save_file

        from recurlen.util.atomic_files import atomic_write

        # safetensors refuses shared storage: a tied head is left out, as transformers does.
        tied = getattr(model.config, fmt.tie_flag)
        state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in model.state_dict().items()
                 if not (tied and k == "lm_head.weight")}
        atomic_write(out / SAFETENSORS_NAME, lambda p: save_file(state, str(p), metadata={"format": "pt"}))
    else:
        # The official .bin files store both tied keys; clone so the two are separate storages in the file.
        state = {k: v.detach().to("cpu", dtype).clone() for k, v in model.state_dict().items()}
        save_torch(state, out / WEIGHTS_NAME)


__all__ = ["CONFIG_NAME", "RECURLEN_CONFIG_NAME", "SAFETENSORS_NAME", "WEIGHTS_NAME", "OfficialFormat", "load_strict",
           "read_config", "read_official_json", "read_state_dict", "save"]
