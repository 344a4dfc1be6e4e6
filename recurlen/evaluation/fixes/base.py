"""The interface every training-free fix has, and what one records.

    fix = FIXES["mambaextend"]
    fix.applies_to(registry.get("mamba2"))                      # through the architecture's model class
    cfg = fix.make_config({"steps": 20})                        # its typed settings (unknown keys: one line)
    record = fix.apply(model, cfg, calibration=seqs_NL, train_len=T)   # changes `model` in place

A fix changes a loaded model in place and returns a FixRecord; the model keeps the recurrent-model interface, so
the evaluation, the tasks, the report and the export use it unchanged. What a fix needs of a model is a set of
timescale knobs (recurlen.models.timescales) that the architecture's LM class names: the fix applies to exactly
the architectures that offer them, and refuses any other by name.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import torch
from omegaconf import OmegaConf

from recurlen.models import registry, timescales
from recurlen.models.interface import Architecture
from recurlen.util.arguments import check_finite
from recurlen.util.errors import UserError


@dataclass
class CalibrationData:
    """What a fix is calibrated on: held-out sequences of the target length, never those the evaluation scores."""

    sequences: int = 4
    """Held-out sequences the calibration runs on (the ones after the evaluation's)."""
    length: int | None = None
    """Tokens per calibration sequence (the target length). None: the evaluation's seq_len."""
    chunk_len: int = 256
    """Tokens per forward call during calibration."""

    def __post_init__(self) -> None:
        for name in ("sequences", "chunk_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer; got {getattr(self, name)}")
        if self.length is not None and self.length < 2:
            raise ValueError(f"length must be >= 2 tokens or None; got {self.length}")

    def rows_needed(self) -> int:
        """Held-out sequences this calibration reads (0 when the settings leave nothing to calibrate)."""
        return self.sequences


@dataclass
class CalibrationConfig(CalibrationData):
    """A calibration by steps of an optimiser: the data, and how long and how."""

    steps: int = 20
    """Calibration steps (SPSA: 3 forward passes each; backprop: one forward and backward). 0: no calibration."""
    method: str = "spsa"
    """spsa (zeroth order, as MambaExtend) or backprop (gradients of the calibration loss in the scales)."""
    seed: int = 0
    """Seed of SPSA's perturbations."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.method not in ("spsa", "backprop"):
            raise ValueError(f"method must be spsa or backprop; got {self.method!r}")
        if self.steps < 0:
            raise ValueError(f"steps must be >= 0; got {self.steps}")

    def rows_needed(self) -> int:
        return self.sequences if self.steps else 0


@dataclass
class FixRecord:
    """What a fix did to a model: results.json's `fix` entry."""

    name: str
    paper: str
    config: dict[str, Any]
    calibrated_parameters: int
    """Numbers the calibration chose (post-training updates every parameter of the model)."""
    values: dict[str, Any] = field(default_factory=dict)
    """The chosen values (per-layer scales, the memory cap), for the reader."""
    calibration: dict[str, Any] | None = None
    """seed, steps, method, data (sequences x length, which rows), loss before / after, forward passes, seconds."""

    def to_dict(self) -> dict:
        return asdict(self)


class Fix:
    """A training-free fix: subclasses set the class attributes and write `apply`."""

    name: ClassVar[str]
    paper: ClassVar[str]
    """Where the method comes from (authors, venue, code)."""
    needs: ClassVar[tuple[str, ...]]
    """Timescale knobs the model's class must offer (recurlen.models.timescales.KNOBS)."""
    config_cls: ClassVar[type]

    @classmethod
    def applies_to(cls, architecture: Architecture) -> bool:
        return set(cls.needs) <= set(timescales.knobs(architecture.model_cls))

    @classmethod
    def architectures(cls) -> list[str]:
        """The registry's architectures it applies to."""
        return [name for name, a in registry.architectures().items() if cls.applies_to(a)]

    @classmethod
    def check_model(cls, model: torch.nn.Module) -> None:
        """A UserError naming the model's architecture when the fix does not apply to it."""
        try:
            arch = registry.of_model(model)
        except ValueError:
            arch = None
        if arch is None or not cls.applies_to(arch):
            what = f"{arch.title} ({arch.name})" if arch else type(model).__name__
            raise UserError(f"fix {cls.name} does not apply to {what}: it scales {'/'.join(cls.needs)} of each layer, "
                            f"which only {cls.architectures()} offer")

    @classmethod
    def make_config(cls, settings: dict[str, Any] | None = None, *, key: str | None = None):
        """The fix's typed settings from a mapping (fix.KEY.SETTING=VALUE on the command line; `key` names them in
        the errors, the fix's name by default)."""
        try:
            merged = OmegaConf.merge(OmegaConf.structured(cls.config_cls), OmegaConf.create(dict(settings or {})))
            # Typed now (`nan` is a float here, a string before): every command's rule for non-finite settings.
            check_finite(OmegaConf.to_container(merged), prefix=f"fix.{key or cls.name}")
            return OmegaConf.to_object(merged)
        except Exception as err:  # omegaconf's own errors (unknown key, wrong type) and __post_init__'s ValueError
            first = str(err).strip().splitlines()[0]
            raise UserError(f"fix {cls.name}: {first}; its settings: {sorted(cls.config_cls.__dataclass_fields__)}") \
                from None

    def apply(self, model: torch.nn.Module, cfg, *, calibration: torch.Tensor | None, train_len: int) -> FixRecord:
        raise NotImplementedError


def calibration_data(cfg: CalibrationData, calibration: torch.Tensor | None, *, name: str) -> torch.Tensor:
    """The calibration rows cut to cfg.length; a UserError when there are too few or too short."""
    if calibration is None or calibration.shape[0] < cfg.sequences:
        have = 0 if calibration is None else calibration.shape[0]
        raise UserError(f"fix {name}: calibration needs {cfg.sequences} held-out sequences beside the evaluation's; "
                        f"got {have} (lower fix.{name}.sequences)")
    length = cfg.length or calibration.shape[1]
    if calibration.shape[1] < length:
        raise UserError(f"fix {name}: calibration length {length} exceeds the held-out sequences' "
                        f"{calibration.shape[1]} tokens; set fix.{name}.length <= {calibration.shape[1]}")
    return calibration[:cfg.sequences, :length]


def data_record(data: torch.Tensor, *, length: int | None = None) -> dict:
    """A calibration record's `data` entry: how many held-out sequences of how many tokens, and which rows."""
    return {"sequences": int(data.shape[0]), "length": int(data.shape[1] if length is None else length),
            "rows": "the held-out sequences after the evaluation's"}


__all__ = ["CalibrationConfig", "CalibrationData", "Fix", "FixRecord", "calibration_data", "data_record"]
