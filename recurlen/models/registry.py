"""The registry of architectures: the one module above models/<arch>/ that names them.

Everything above models/ finds an architecture here (by name, by model, by config, by checkpoint directory);
nothing else imports an architecture's folder.
"""

from __future__ import annotations

import functools
import importlib
import json
import pkgutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from recurlen import models
from recurlen.models import table
from recurlen.models.interface import Architecture
from recurlen.util.errors import UserError

DEFAULT = "mamba2"
# The order architectures are listed in (help, errors, reports); folders not named here follow, by name.
ORDER = ("mamba2", "mamba1", "gla")

_registered: dict[str, Architecture] = {}


@functools.cache
def _folders() -> dict[str, Architecture]:
    """The ARCHITECTURE entry of every folder of recurlen/models/ that has an architecture.py.

    Found on first use, not imported at module load: each entry imports its folder, and nothing above models/
    needs to know which folders exist. Every directory of the package's search path counts (a folder copied
    elsewhere and put on `recurlen.models.__path__` is found like one of recurlen's own)."""
    found = {}
    for info in pkgutil.iter_modules(models.__path__):
        if info.ispkg and (Path(info.module_finder.path) / info.name / "architecture.py").is_file():
            entry = importlib.import_module(f"recurlen.models.{info.name}.architecture").ARCHITECTURE
            found[entry.name] = entry
    return found


def architectures() -> dict[str, Architecture]:
    """Every architecture by name: recurlen's folders, then any registered from outside (`register`)."""
    found = {**_folders(), **_registered}
    rank = {name: i for i, name in enumerate(ORDER)}
    return dict(sorted(found.items(), key=lambda item: (rank.get(item[0], len(rank)), item[0])))


def register(architecture: Architecture, models: Sequence[table.ModelRow] = ()) -> None:
    """Add an architecture defined outside recurlen/models/ (a plug-in, or a test's toy model), with its named
    models (rows as in recurlen.models.table: `model=NAME` then composes them like recurlen's own)."""
    if architecture.name in _folders():
        raise ValueError(f"architecture {architecture.name!r} is recurlen's own; register another name")
    strangers = sorted({row.architecture for row in models} - {architecture.name})
    if strangers:
        raise ValueError(f"models registered with {architecture.name!r} must be of it; got architectures {strangers}")
    unregister(architecture.name)
    table.add(models)
    _registered[architecture.name] = architecture


def unregister(name: str) -> None:
    """Forget a registered architecture and its models."""
    _registered.pop(name, None)
    table.remove(name)


def get(name: str) -> Architecture:
    registry = architectures()
    if name not in registry:
        raise ValueError(f"unknown architecture {name!r}; allowed: {sorted(registry)}")
    return registry[name]


def of_model(model: torch.nn.Module) -> Architecture:
    for arch in architectures().values():
        if isinstance(model, arch.model_cls):
            return arch
    raise ValueError(f"{type(model).__name__} is not a recurlen architecture; known: "
                     f"{[a.model_cls.__name__ for a in architectures().values()]}")


def of_config(config: Any) -> Architecture:
    for arch in architectures().values():
        if isinstance(config, arch.config_cls):
            return arch
    raise ValueError(f"{type(config).__name__} is not the config of a recurlen architecture")


def detect(directory: Path) -> Architecture:
    """The architecture of a checkpoint directory, from its official config.json; or of a weights file, from the
    architectures whose release format is one file (`weights_file`)."""
    if Path(directory).is_file():
        return _detect_file(Path(directory))
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{directory} has no config.json")
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{path} is not valid JSON ({err}); write or download it again") from err
    if not isinstance(raw, dict):
        raise UserError(f"{path} holds a JSON {type(raw).__name__}, not a model config (an object)")
    found = [a for a in architectures().values() if a.recognises(raw)]
    if len(found) != 1:
        raise UserError(f"{path} is {'ambiguous between ' + str([a.name for a in found]) if found else 'not'} "
                         f"a config of a known architecture ({sorted(architectures())})")
    return found[0]


def _detect_file(path: Path) -> Architecture:
    from recurlen.models.weights_file import read_tensors

    candidates = [a for a in architectures().values()
                  if a.model_cls.weights_file is not None and a.model_cls.weights_file.handles(path)]
    if candidates:
        tensors = read_tensors(path)
        found = [a for a in candidates if a.model_cls.weights_file.recognises(tensors)]
        if len(found) == 1:
            return found[0]
    formats = sorted(f"{a.name}: {a.model_cls.weights_file.suffix}" for a in architectures().values()
                     if a.model_cls.weights_file is not None)
    known = ", ".join(formats) or "none"
    raise UserError(f"{path} is a file but not a weights file of a known architecture ({known}); pass a checkpoint "
                    "directory holding config.json")


__all__ = ["DEFAULT", "ORDER", "architectures", "detect", "get", "of_config", "of_model", "register", "unregister"]
