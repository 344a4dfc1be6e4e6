"""Official-format checkpoints of every architecture: a directory with config.json and the weights.

An architecture declares its format (`OfficialFormat`: which weights file it writes, its embedding key and
tied-head flag, old key names it accepts); reading, strict loading and writing are written once, here. Loading
is strict: missing, unexpected or mis-shaped keys name themselves in a one-line error.

Next to config.json recurlen writes recurlen_config.json, its exact config (fields the official config.json
cannot hold, e.g. A_init_log_uniform), in its own file so that the reference library still loads the directory.
It is strict JSON: a float JSON cannot hold (an infinite dt_limit) is written as transformers writes it in its
configs, {"__float__": "Infinity"} ("-Infinity", "NaN"), and read back as the float.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from recurlen.models.timescales import prepare_to_write
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
    library: str = ""
    """The reference library that reads this format (mamba-ssm, fla): a model card's library_name."""
    loading: str = ""
    """How that library loads a directory of this format (one line of Python, DIR standing for it)."""


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


FLOAT_TAG = "__float__"
_SPECIAL_FLOATS = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}


def encode_floats(obj: Any) -> Any:
    """obj with every infinite or NaN float as {"__float__": "Infinity" | "-Infinity" | "NaN"} (strict JSON)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return {FLOAT_TAG: "NaN" if math.isnan(obj) else ("Infinity" if obj > 0 else "-Infinity")}
    if isinstance(obj, dict):
        return {k: encode_floats(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [encode_floats(v) for v in obj]
    return obj


def decode_floats(obj: Any) -> Any:
    """encode_floats undone."""
    if isinstance(obj, dict):
        if set(obj) == {FLOAT_TAG} and obj[FLOAT_TAG] in _SPECIAL_FLOATS:
            return _SPECIAL_FLOATS[obj[FLOAT_TAG]]
        return {k: decode_floats(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [decode_floats(v) for v in obj]
    return obj


def read_official_json(directory: Path) -> dict[str, Any]:
    path = Path(directory) / CONFIG_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{directory} has no {CONFIG_NAME}")
    return _read_json(path)


def read_config(directory: Path, config_cls: type, *, from_json: Callable[..., Any] | None = None) -> Any:
    """recurlen's exact config if the directory has one, else its config.json mapped onto config_cls by
    `from_json(raw, source=)` (default: the official config.json, config_cls.from_official_json)."""
    own = Path(directory) / RECURLEN_CONFIG_NAME
    if own.is_file():
        try:
            return config_cls.from_dict(decode_floats(_read_json(own)))
        except (TypeError, ValueError) as err:  # e.g. config.json replaced by another architecture's, this one not
            raise UserError(f"{own} does not describe the {config_cls.__name__} that {CONFIG_NAME} next to it "
                            f"describes ({err}); the two files come from different models: restore the directory, "
                            f"or delete {RECURLEN_CONFIG_NAME} to load from {CONFIG_NAME} alone") from err
    from_json = from_json or config_cls.from_official_json
    return from_json(read_official_json(directory), source=str(Path(directory) / CONFIG_NAME))


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
        elif head is not None and emb is not None and head.shape != emb.shape:
            raise UserError(f"{source}: {fmt.tie_flag} is true but lm_head.weight has shape {tuple(head.shape)} and "
                            f"{fmt.embedding_key} {tuple(emb.shape)} (a tied head is the embedding itself)")
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


WEIGHTS_FILES = {"safetensors": SAFETENSORS_NAME, "bin": WEIGHTS_NAME}
"""The weights files recurlen writes, by the name a `weights=` setting gives them."""


def weights_file(weights: str | None, default: str) -> str:
    """The file a `weights=` choice writes: 'safetensors', 'bin', or None / 'auto' for `default` (a file name)."""
    if weights in (None, "auto"):
        return default
    if weights not in WEIGHTS_FILES:
        raise ValueError(f"weights={weights!r} is unknown; allowed: {['auto', *WEIGHTS_FILES]}")
    return WEIGHTS_FILES[weights]


def write_checkpoint(directory: str | Path, *, config_json: dict[str, Any], recurlen_config: dict[str, Any],
                     state: dict[str, torch.Tensor], weights: str, dtype: torch.dtype,
                     tied_key: str | None) -> Path:
    """config.json, recurlen_config.json and one weights file (`weights`: a file name of WEIGHTS_FILES).

    tied_key: the head tied to the embedding (left out of safetensors files, which refuse shared storage, as
    transformers does). A weights file of the other kind left by an earlier write is removed: with two, which one
    a reader takes would depend on the reader."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / CONFIG_NAME, json.dumps(config_json, indent=2))
    write_text(out / RECURLEN_CONFIG_NAME, json.dumps(encode_floats(recurlen_config), indent=2, allow_nan=False))
    if weights == SAFETENSORS_NAME:
        from safetensors.torch import save_file

        from recurlen.util.atomic_files import atomic_write

        tensors = {k: v.detach().to("cpu", dtype).contiguous() for k, v in state.items() if k != tied_key}
        # safetensors creates its file 0600 (a private temporary renamed into place): give it the mode every other
        # file here got from the umask, so that whoever may read config.json may read the weights.
        mode = (out / CONFIG_NAME).stat().st_mode & 0o777

        def write(p: Path) -> None:
            save_file(tensors, str(p), metadata={"format": "pt"})
            os.chmod(p, mode)

        atomic_write(out / SAFETENSORS_NAME, write)
    else:
        # The official .bin files store both tied keys; clone so the two are separate storages in the file.
        save_torch({k: v.detach().to("cpu", dtype).clone() for k, v in state.items()}, out / WEIGHTS_NAME)
    for other in set(WEIGHTS_FILES.values()) - {weights}:
        (out / other).unlink(missing_ok=True)
    return out / weights


def save(model: nn.Module, directory: str | Path, fmt: OfficialFormat, *, dtype: torch.dtype = torch.float32,
         weights: str | None = None) -> Path:
    """The official layout; float32 by default so that a round trip is exact (pass float16 to match the hub).
    weights: 'safetensors', 'bin', or None for the format's own file (what its reference library reads)."""
    prepare_to_write(model)  # a fix's scale is folded into the weights or refused, never dropped
    return write_checkpoint(directory, config_json=model.config.to_official_json(),
                            recurlen_config=model.config.to_dict(), state=model.state_dict(),
                            weights=weights_file(weights, fmt.weights), dtype=dtype,
                            tied_key="lm_head.weight" if getattr(model.config, fmt.tie_flag) else None)


__all__ = ["CONFIG_NAME", "FLOAT_TAG", "RECURLEN_CONFIG_NAME", "SAFETENSORS_NAME", "WEIGHTS_FILES", "WEIGHTS_NAME",
           "OfficialFormat", "decode_floats", "encode_floats", "load_strict", "read_config", "read_official_json",
           "read_state_dict", "save", "weights_file", "write_checkpoint"]
