"""The registry of architectures: the one module above models/<arch>/ that names them.

Everything above models/ finds an architecture here (by name, by model, by config, by checkpoint directory);
nothing else imports an architecture's folder.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import torch

from recurlen.models.interface import Architecture


@functools.lru_cache(maxsize=1)
def architectures() -> dict[str, Architecture]:
    """Every registered architecture by name. A new one adds its package and one line here.

    Built on first use: each entry imports its package, which imports this module's Architecture.
    """
    from recurlen.models.gla.architecture import ARCHITECTURE as GLA
    from recurlen.models.mamba1.architecture import ARCHITECTURE as MAMBA1
    from recurlen.models.mamba2.architecture import ARCHITECTURE as MAMBA2

    return {a.name: a for a in (MAMBA2, MAMBA1, GLA)}


DEFAULT = "mamba2"
NAMES = ("mamba2", "mamba1", "gla")


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
    """The architecture of a checkpoint directory, from its official config.json."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{directory} has no config.json")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from err
    found = [a for a in architectures().values() if a.recognises(raw)]
    if len(found) != 1:
        raise ValueError(f"{path} is {'ambiguous between ' + str([a.name for a in found]) if found else 'not'} "
                         f"a config of a known architecture ({sorted(architectures())})")
    return found[0]


__all__ = ["DEFAULT", "NAMES", "architectures", "detect", "get", "of_config", "of_model"]
