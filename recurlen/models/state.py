"""A recurrent state as a type: named tensors, each (layers, batch, ...), with the lane operations.

Every architecture's state is a dataclass of tensors whose first two dims are (K layers, B lanes).
The operations the rest of recurlen needs (reset lanes, detach, index and concatenate lanes, move,
save, per-layer statistics) act on every part alike, so they are written once here. What differs
between architectures is declared, not coded:
  RECURRENT  the parts that carry the recurrence (float32 always; noise interventions draw these,
             state passing always carries them)
  FRAME      the parts that give the coordinates a recurrent part is written in (Mamba-3's cumulative rotation
             angle): carried wherever the recurrent parts are carried, float32 always, zero under the noise
             interventions (a zero-mean draw of the recurrent part is the same draw in any frame)
  WINDOW     the parts that hold the last inputs of a short causal conv (carried only on request)
  GROUP_DIMS per recurrent part, how many dims after the batch dim index the groups over which
             fitted noise is fitted (1 = per (layer, head); 0 = per layer)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar, TypeVar

import torch

S = TypeVar("S", bound="LayeredState")


@dataclass
class LayeredState:
    RECURRENT: ClassVar[tuple[str, ...]] = ()
    FRAME: ClassVar[tuple[str, ...]] = ()
    WINDOW: ClassVar[tuple[str, ...]] = ()
    GROUP_DIMS: ClassVar[dict[str, int]] = {}

    def __post_init__(self) -> None:
        parts = self.parts()
        for name, t in parts.items():
            if not isinstance(t, torch.Tensor) or t.dim() < 2:
                raise ValueError(f"{type(self).__name__}.{name} must be a tensor (layers, batch, ...); got "
                                 f"{getattr(t, 'shape', type(t).__name__)}")
        lead = {name: tuple(t.shape[:2]) for name, t in parts.items()}
        if len(set(lead.values())) > 1:
            raise ValueError(f"{type(self).__name__} parts disagree on (layers, batch): {lead}")

    # ------------------------------------------------------------------ creation
    @classmethod
    def zeros_for(cls: type[S], config: Any, batch: int, *, device: torch.device | str | None = None) -> S:
        """The zero state of a model with this config, for `batch` lanes (what h_{-1} = 0 means)."""
        raise NotImplementedError(f"{cls.__name__} must define zeros_for(config, batch, device=...)")

    @classmethod
    def from_layers(cls: type[S], layers: Sequence[Sequence[torch.Tensor]]) -> S:
        """Stack per-layer parts (each a tuple in field order) along a new layer dim."""
        return cls(*(torch.stack(list(part)) for part in zip(*layers)))

    def layer(self, i: int) -> tuple[torch.Tensor, ...]:
        """Layer i's parts, in field order (what a block takes and returns)."""
        return tuple(t[i] for t in self.parts().values())

    # ------------------------------------------------------------------ parts
    @classmethod
    def part_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def parts(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in self.part_names()}

    def _map(self: S, fn: Callable[[str, torch.Tensor], torch.Tensor]) -> S:
        return type(self)(**{name: fn(name, t) for name, t in self.parts().items()})

    @property
    def _first(self) -> torch.Tensor:
        return getattr(self, self.part_names()[0])

    @property
    def n_layer(self) -> int:
        return self._first.shape[0]

    @property
    def batch_size(self) -> int:
        return self._first.shape[1]

    @property
    def device(self) -> torch.device:
        return self._first.device

    # ------------------------------------------------------------------ lanes
    @classmethod
    def cat(cls: type[S], states: Sequence[S]) -> S:
        """Concatenate along the lane dimension, e.g. to gather the lanes of several ranks."""
        if not states:
            raise ValueError(f"{cls.__name__}.cat needs at least one state")
        return cls(**{name: torch.cat([getattr(s, name) for s in states], dim=1) for name in cls.part_names()})

    def __getitem__(self: S, rows) -> S:
        """Select lanes (an int, slice, index tensor or boolean mask)."""
        if isinstance(rows, int):
            rows = slice(rows, rows + 1)
        return self._map(lambda _, t: t[:, rows])

    def where(self: S, keep_B: torch.Tensor, other: S) -> S:
        """Per lane: this state where keep_B is True, else `other` (out of place, autograd-safe)."""
        keep_B = keep_B.to(device=self.device, dtype=torch.bool)
        if keep_B.shape != (self.batch_size,):
            raise ValueError(f"mask must have shape ({self.batch_size},); got {tuple(keep_B.shape)}")

        def pick(name: str, t: torch.Tensor) -> torch.Tensor:
            mask = keep_B.view(1, -1, *([1] * (t.dim() - 2)))
            return torch.where(mask, t, getattr(other, name).to(t.dtype))

        return self._map(pick)

    def reset(self: S, reset_B: torch.Tensor) -> S:
        """Zero the lanes where reset_B is True (out of place)."""
        return self.where(~reset_B.to(device=self.device, dtype=torch.bool), self.zeros_like())

    # ------------------------------------------------------------------ transforms
    def detach(self: S) -> S:
        """Cut the graph: what truncated BPTT / state passing do between steps."""
        return self._map(lambda _, t: t.detach())

    def clone(self: S) -> S:
        return self._map(lambda _, t: t.clone())

    def zeros_like(self: S) -> S:
        return self._map(lambda _, t: torch.zeros_like(t))

    def to(self: S, device: torch.device | str | None = None, *, window_dtype: torch.dtype | None = None) -> S:
        """Move every part; recurrent parts stay float32, windows may take the model's dtype."""
        return self._map(lambda n, t: t.to(device=device, dtype=window_dtype if n in self.WINDOW else None))

    @classmethod
    def float32_parts(cls) -> tuple[str, ...]:
        """The parts kept in float32: the recurrent parts and their frames (they accumulate over long inputs)."""
        return cls.RECURRENT + cls.FRAME

    def recurrent_only(self: S) -> S:
        """The recurrent parts (and their frames) with the conv windows zeroed: what the paper's pseudocode
        passes. A recurrent part without its frame would be read in the wrong coordinates."""
        return self._map(lambda n, t: torch.zeros_like(t) if n in self.WINDOW else t)

    # ------------------------------------------------------------------ checks / io
    def check_like(self, want: LayeredState) -> None:
        """Same type, shapes and device kind as `want` (the model's zero state for this batch)."""
        if type(self) is not type(want):
            raise ValueError(f"state must be a {type(want).__name__} or None; got {type(self).__name__}")
        for name, t in self.parts().items():
            w = getattr(want, name)
            if tuple(t.shape) != tuple(w.shape):
                raise ValueError(f"state.{name} has shape {tuple(t.shape)}; this model and batch need "
                                 f"{tuple(w.shape)}")
            if name in self.float32_parts() and t.dtype not in (torch.float32, torch.float64):
                raise ValueError(f"state.{name} must be float32 (it accumulates over long inputs; float64 is "
                                 f"allowed for double-precision checks); got {t.dtype}")
            if not t.dtype.is_floating_point:
                raise ValueError(f"state.{name} must be a floating-point tensor; got {t.dtype}")
            if t.device.type != w.device.type:
                raise ValueError(f"state.{name} is on {t.device} but the model is on {w.device}")

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {name: t.detach().cpu() for name, t in self.parts().items()}

    @classmethod
    def from_state_dict(cls: type[S], d: dict[str, torch.Tensor]) -> S:
        missing = sorted(set(cls.part_names()) - set(d))
        if missing:
            raise ValueError(f"a saved {cls.__name__} needs keys {list(cls.part_names())}; missing {missing}")
        return cls(**{n: d[n].float() if n in cls.float32_parts() else d[n] for n in cls.part_names()})

    def norms(self) -> dict[str, torch.Tensor]:
        """Per-layer RMS of each part over everything but the layer dim: cheap summaries for logging."""
        out = {}
        for name, t in self.parts().items():
            t = t.detach().float()
            out[f"{name}_rms_K"] = t.pow(2).flatten(1).mean(dim=1).sqrt() if t[0].numel() else t.new_zeros(t.shape[0])
        return out

    def group_view(self, name: str) -> torch.Tensor:
        """A recurrent part as (K, G, M): G groups (see GROUP_DIMS), M samples per group over lanes and entries."""
        t = getattr(self, name)
        g = self.GROUP_DIMS.get(name, 0)
        groups = t.shape[2:2 + g]
        # (K, B, *groups, *rest) -> (K, *groups, B, *rest) -> (K, G, M)
        moved = t.movedim(1, 1 + g)
        return moved.reshape(t.shape[0], int(torch.Size(groups).numel()), -1)


__all__ = ["LayeredState"]
