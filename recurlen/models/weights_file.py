"""Checkpoints that are one weights file and no config.json: an architecture's own release format (e.g. a `.pth`
of named tensors), whose config is read off the weights' shapes.

An architecture that has such a format declares it as its LM class's `weights_file` (a `WeightsFileFormat`);
`StatefulLM.from_pretrained` then takes such a file where it takes a directory, and `registry.detect` recognises it.
Reading the file is written once here; what the names and shapes mean is the architecture's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from recurlen.models.timescales import prepare_to_write
from recurlen.util.errors import UserError, load_error


@dataclass(frozen=True)
class WeightsFileFormat:
    suffix: str
    """The file's suffix (".pth")."""
    description: str
    """What it is, for messages."""
    read: Callable[[dict[str, torch.Tensor], str], tuple[Any, dict[str, torch.Tensor]]]
    """(the file's tensors, its name for messages) -> (the config, the state dict under the model's own names);
    one-line UserErrors for what it refuses."""
    recognises: Callable[[dict[str, torch.Tensor]], bool]
    """Is a state dict, as stored in such a file, this architecture's?"""
    write: Callable[[nn.Module], dict[str, torch.Tensor]] | None = None
    """model -> the tensors of such a file (torch.save writes it); None where recurlen does not write the format."""

    def handles(self, path: str | Path) -> bool:
        return Path(path).is_file() and Path(path).suffix == self.suffix

    def load(self, path: str | Path) -> tuple[Any, dict[str, torch.Tensor]]:
        return self.read(read_tensors(Path(path)), str(path))

    def save(self, model: nn.Module, path: str | Path) -> Path:
        if self.write is None:
            raise ValueError(f"recurlen does not write {self.description}")
        from recurlen.util.atomic_files import save_torch

        prepare_to_write(model)  # a fix's scale is folded into the weights or refused, never dropped
        save_torch({k: v.detach().cpu().clone() for k, v in self.write(model).items()}, Path(path))
        return Path(path)


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """A file of named tensors (torch.save of a dict), read without running code from it (memory-mapped)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # torch says little more than the pickle opcode it choked on
        raise load_error(path, err) from err
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UserError(f"{path} is not a state dict (name -> tensor); write or download it again")
    return state


__all__ = ["WeightsFileFormat", "read_tensors"]
