"""What every architecture's config dataclass shares: validation helpers, a padded vocabulary, and the
dict form saved in checkpoints (`to_dict` / `from_dict`, which refuses unknown keys by name)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, fields
from typing import Any, TypeVar

from recurlen.util.errors import UserError

C = TypeVar("C", bound="ModelConfig")


class ModelConfig:
    """A mixin for an architecture's config dataclass (fields and __post_init__ are the architecture's).

    What recurlen asks of every config: `n_layer` and `vocab_size` (fields or properties), and the four methods
    below that raise NotImplementedError here; `to_dict` / `from_dict` and the checks come with the mixin."""

    def describe(self) -> str:
        """One line for reports: the architecture and its shape."""
        raise NotImplementedError(f"{type(self).__name__} must define describe()")

    @staticmethod
    def recognises(raw: dict[str, Any]) -> bool:
        """True for an official config.json of this architecture (default: it has no official format)."""
        return False

    def to_official_json(self) -> dict[str, Any]:
        """The official config.json of this config (what the reference library reads)."""
        raise NotImplementedError(f"{type(self).__name__} must define to_official_json()")

    @classmethod
    def from_official_json(cls: type[C], raw: dict[str, Any], *, source: str = "config.json") -> C:
        """A config from an official config.json; what recurlen cannot run is refused with the key named."""
        raise NotImplementedError(f"{cls.__name__} must define from_official_json()")

    def check_positive_ints(self, names: Iterable[str]) -> None:
        for name in names:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"model config: {name} must be a positive integer; got {value!r}")

    def to_dict(self) -> dict[str, Any]:
        """Plain types only (tuples as lists), as a checkpoint's metadata and recurlen_config.json hold it."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls: type[C], d: dict[str, Any]) -> C:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"model config: unknown keys {unknown}; allowed: {sorted(known)}")
        return cls(**d)


def refuse_decay_clamp(field: str, value: float | None, *, target: str, consequence: str, model: str) -> None:
    """A model-organism clamp on the decay (recurlen's own field, off by default) has no place in an official format:
    writing the weights without it would give another model there, so the export is refused in one line."""
    if value is not None:
        raise UserError(f"model config: {field}={value} clamps the decay, which {target} cannot express: "
                        f"{consequence}; export {model} trained without the clamp ({field}: null)")


def padded(size: int, multiple: int) -> int:
    """size rounded up to a multiple (embedding rows: 50277 -> 50288 for multiples of 16)."""
    return int(math.ceil(size / multiple) * multiple)


__all__ = ["ModelConfig", "padded", "refuse_decay_clamp"]
