"""The recurrent-model interface every architecture provides, and the registry entry that describes one.

Everything above the core (training, interventions, data lanes, callbacks, evaluation, tasks, runs)
talks to a model only through this interface:

    logits, state = model(ids_BL, state)            # state in (None = zeros), final state out
    hidden, state = model.forward_hidden(ids_BL, state);  logits = model.logits_from_hidden(hidden)
    logits_BV, state = model.step(ids_B, state)     # one token, for generation
    model.zero_state(batch, device=...)             # a typed LayeredState (see layered_state.py)
    model.config                                    # the architecture's config dataclass (to_dict/from_dict)
    model.save_pretrained(dir) / Arch.load_pretrained(dir)   # the architecture's official format (loading also
                                                            # takes transformers' format, where it has one)
    model.backend                                   # 'auto' | 'torch' | 'kernel'

and the state's own operations (reset per lane, detach, index / cat lanes, to, state_dict, per-layer
norms, the recurrent parts state passing carries, the groups fitted noise is fitted over).

An architecture is one folder of recurlen/models/ (config, state, scan, kernels, model, its `ARCHITECTURE`
entry); nothing outside its folder asks which architecture a model is. The shell every LM shares is
recurlen.models.lm.StatefulLM.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from recurlen.models import official, table
from recurlen.models.lm import StatefulLM
from recurlen.models.state import LayeredState
from recurlen.models.transformers_format import TransformersFormat


@runtime_checkable
class RecurrentLM(Protocol):
    """What recurlen needs from a language model (Mamba2LM, Mamba1LM and GLALM provide it)."""

    config: Any
    backend: str

    def __call__(self, input_ids: torch.Tensor, state: LayeredState | None = None, *, backend: str | None = None,
                 resets: torch.Tensor | None = None) -> tuple[torch.Tensor, LayeredState]: ...

    def forward_hidden(self, input_ids: torch.Tensor, state: LayeredState | None = None, *,
                       backend: str | None = None,
                       resets: torch.Tensor | None = None) -> tuple[torch.Tensor, LayeredState]: ...

    def logits_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor: ...

    def step(self, input_ids_B: torch.Tensor, state: LayeredState | None = None) -> tuple[torch.Tensor, LayeredState]:
        ...

    def zero_state(self, batch: int, *, device: torch.device | str | None = None) -> LayeredState: ...

    def save_pretrained(self, directory: str, *, dtype: torch.dtype = torch.float32,
                        weights: str | None = None) -> None: ...


@dataclass(frozen=True)
class Architecture:
    """An architecture's entry in the registry: its LM class (which names its config, state type, kernels and
    checkpoint format) and how it is named and shown. Its named models are rows of the model table
    (recurlen.models.table)."""

    name: str
    """Registry key, used in configs, run metadata, commands and the model table's rows (mamba2, mamba1, ...)."""
    title: str
    """Human name for reports (Mamba-2, ...)."""
    model_cls: type[StatefulLM]
    demo_cost: float = 1.0
    """Its CPU demo's wall time relative to Mamba-2's on the same machine (`make demo ARCH=name`): the demo bar's
    first estimate only, replaced by the speed measured as the demo runs."""
    variants: tuple[Mapping[str, Any], ...] = field(default=(), hash=False)
    """Config fields that give its state or scan a shape its nano model lacks (Mamba-2's grouped B and C, GLA's
    short convolutions, whose windows join the state): the shared tests check each on top of the nano model, so
    that a shape no CPU preset has is covered too. Empty where the nano model has every shape."""

    @property
    def config_cls(self) -> type:
        return self.model_cls.config_cls

    @property
    def state_cls(self) -> type[LayeredState]:
        return self.model_cls.state_cls

    @property
    def transformers_format(self) -> TransformersFormat | None:
        """Its format in transformers (config.json + weights AutoModelForCausalLM loads); None where transformers
        has no class for it."""
        return self.model_cls.transformers

    def recognises(self, raw: dict[str, Any]) -> bool:
        """True for a config.json of this architecture: its official one, or transformers' where it has one."""
        fmt = self.transformers_format
        return self.config_cls.recognises(raw) or (fmt is not None and fmt.recognises(raw))

    def describe(self, config: Any) -> str:
        """One line for reports: the shape of a config."""
        return config.describe()

    def model_names(self) -> list[str]:
        """This architecture's names in the model table, sorted."""
        return table.names(self.name)

    @property
    def prefix(self) -> str:
        """What this architecture's model names put before a size ('' for Mamba-2's 780m, 'mamba1-' for
        mamba1-790m)."""
        return f"{self.name}-" if any(row.name != row.size for row in table.rows(self.name)) else ""

    @property
    def presets(self) -> dict[str, dict[str, Any]]:
        """Size -> shape of this architecture's rows of the model table (a view; the table is where they are
        written)."""
        return {row.size: dict(row.shape) for row in table.rows(self.name)}

    def preset(self, name: str, **overrides: Any):
        """The config of a named model, by its model name (mamba1-tiny) or its size (tiny), fields overridden."""
        row = table.find(name, architecture=self.name)
        if row is None:
            raise ValueError(f"unknown {self.title} preset {name!r}; allowed: {self.model_names()}")
        return self.config_cls(**{**row.shape, **overrides})

    def config_from_dict(self, d: dict[str, Any]):
        return self.config_cls.from_dict(dict(d))

    def build(self, config, *, backend: str = "auto") -> StatefulLM:
        return self.model_cls(config, backend=backend)

    def load_state_dict(self, model: StatefulLM, state_dict: dict[str, torch.Tensor], source: str) -> None:
        """Strict load of official-named weights into a model (missing / extra / mis-shaped keys raise)."""
        official.load_strict(model, state_dict, self.model_cls.official, source=source)

    def load_pretrained(self, directory: Path, *, backend: str = "auto", device=None,
                        dtype: torch.dtype = torch.float32) -> StatefulLM:
        return self.model_cls.from_pretrained(str(directory), backend=backend, device=device, dtype=dtype)


__all__ = ["Architecture", "RecurrentLM"]
