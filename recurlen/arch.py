"""The recurrent-model interface, and the registry of architectures that provide it.

Everything above the core (training, interventions, data lanes, callbacks, evaluation, tasks, runs)
talks to a model only through this interface:

    logits, state = model(ids_BL, state)            # state in (None = zeros), final state out
    hidden, state = model.forward_hidden(ids_BL, state);  logits = model.logits_from_hidden(hidden)
    logits_BV, state = model.step(ids_B, state)     # one token, for generation
    model.zero_state(batch, device=...)             # a typed LayeredState (see layered_state.py)
    model.config                                    # the architecture's config dataclass (to_dict/from_dict)
    model.save_pretrained(dir) / Arch.load_pretrained(dir)   # the architecture's official format
    model.backend                                   # 'auto' | 'torch' | 'kernel'

and the state's own operations (reset per lane, detach, index / cat lanes, to, state_dict, per-layer
norms, the recurrent parts state passing carries, the groups fitted noise is fitted over).

An architecture is one package (config, state, scans, model, checkpoint) plus one `Architecture`
entry below; nothing outside its package asks which architecture a model is.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from recurlen.layered_state import LayeredState


@runtime_checkable
class RecurrentLM(Protocol):
    """What recurlen needs from a language model (Mamba2LM, Mamba1LM and GLALM provide it)."""

    config: Any
    backend: str

    def __call__(self, input_ids: torch.Tensor, state: LayeredState | None = None, *,
                 backend: str | None = None) -> tuple[torch.Tensor, LayeredState]: ...

    def forward_hidden(self, input_ids: torch.Tensor, state: LayeredState | None = None, *,
                       backend: str | None = None) -> tuple[torch.Tensor, LayeredState]: ...

    def logits_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor: ...

    def step(self, input_ids_B: torch.Tensor, state: LayeredState | None = None) -> tuple[torch.Tensor, LayeredState]:
        ...

    def zero_state(self, batch: int, *, device: torch.device | str | None = None) -> LayeredState: ...

    def save_pretrained(self, directory: str, *, dtype: torch.dtype = torch.float32) -> None: ...


@dataclass(frozen=True)
class Architecture:
    name: str
    """Registry key, used in configs, run metadata and commands (mamba2, mamba1, gla)."""
    title: str
    """Human name for reports (Mamba-2, ...)."""
    prefix: str
    """Model names in experiments/model/ are prefix + preset ('' for Mamba-2: tiny, 780m; mamba1-790m; gla-340m)."""
    config_cls: type
    model_cls: type
    state_cls: type[LayeredState]
    presets: dict[str, dict[str, Any]]
    recognises: Callable[[dict[str, Any]], bool]
    """True for an official config.json of this architecture."""
    read_config: Callable[[Path], Any]
    """The config of a checkpoint directory (recurlen's exact config if present, else the official one)."""
    load_state_dict: Callable[[torch.nn.Module, dict[str, torch.Tensor], str], None]
    """Strict load of official-named weights into a model (missing / extra / mis-shaped keys raise)."""
    read_state_dict: Callable[[Path], dict[str, torch.Tensor]]
    describe: Callable[[Any], str]
    """One line for reports: the shape of a config."""
    official_marker: str
    """Part of an official checkpoint's directory / hub name (mamba2-, mamba-, gla-)."""
    official_seq_len: int = 2048
    """The context the official checkpoints were pre-trained at (what 'past T' means for them)."""

    def official_train_seq_len(self, directory: Path) -> int | None:
        return self.official_seq_len if self.official_marker in str(directory) else None

    def preset(self, name: str, **overrides: Any):
        """A preset by its own name (tiny) or its model name (mamba1-tiny)."""
        key = name[len(self.prefix):] if self.prefix and name.startswith(self.prefix) else name
        if key not in self.presets:
            raise ValueError(f"unknown {self.title} preset {name!r}; allowed: {sorted(self.presets)}")
        return self.config_cls(**{**self.presets[key], **overrides})

    def model_names(self) -> list[str]:
        return sorted(self.prefix + key for key in self.presets)

    def config_from_dict(self, d: dict[str, Any]):
        return self.config_cls.from_dict(dict(d))

    def build(self, config, *, backend: str = "auto") -> torch.nn.Module:
        return self.model_cls(config, backend=backend)

    def load_pretrained(self, directory: Path, *, backend: str = "auto", device=None,
                        dtype: torch.dtype = torch.float32) -> torch.nn.Module:
        model = self.build(self.read_config(directory), backend=backend)
        self.load_state_dict(model, self.read_state_dict(directory), str(directory))
        return model.to(device=device, dtype=dtype)


@functools.lru_cache(maxsize=1)
def architectures() -> dict[str, Architecture]:
    """Every registered architecture by name. A new one adds its package and one line here.

    Built on first use: each entry imports its package, which imports this module's Architecture.
    """
    from recurlen.gla.architecture import ARCHITECTURE as GLA
    from recurlen.mamba1.architecture import ARCHITECTURE as MAMBA1
    from recurlen.mamba2_architecture import ARCHITECTURE as MAMBA2

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


__all__ = ["DEFAULT", "NAMES", "Architecture", "RecurrentLM", "architectures", "detect", "get", "of_config", "of_model"]
