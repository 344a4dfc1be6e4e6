"""recurlen_export.json: which files `recurlen export` wrote into a directory, and what it knew of the training.

An export directory may also hold the user's own files: a later export replaces (or removes, when it no longer
writes them) only the files listed here, and only when the record says the directory is an export of the same run.
What it records of the training lets `recurlen eval DIR` measure an export as it would the run: the context T (in
units of which it bins positions; load_model reads it) and the run's data settings (the held-out documents it reads,
recurlen.evaluation.heldout), without being told either.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

MANIFEST_NAME = "recurlen_export.json"
FORMAT = 1
MACHINE_DATA_KEYS = ("cache_dir", "num_workers", "num_proc", "pin_memory")
"""Data settings that describe the machine a run trained on, not its data: left out of the record (a cache path
names someone's machine, and the evaluating machine has its own)."""


@dataclass
class ExportManifest:
    run: str
    """The exported run's (or directory's) name, as the model card's title shows it."""
    source_id: str
    """A digest of the exported run directory's (or source's) absolute path: tells an export of the same run from
    another without writing the machine's paths into a directory meant to be shared."""
    train_seq_len: int | None = None
    """T, the training context of the exported model (None where the source did not record it)."""
    files: list[str] = field(default_factory=list)
    """The files the export wrote, relative to the directory (this record included)."""
    data: dict | None = None
    """The exported run's data settings (its config's data section, less this machine's cache, worker and memory
    settings: MACHINE_DATA_KEYS); None where the source is no recurlen run."""
    format: int = FORMAT

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, allow_nan=False)


def source_id(path: str | Path) -> str:
    return hashlib.sha256(str(Path(path).expanduser().resolve()).encode()).hexdigest()[:16]


def read_manifest(directory: str | Path) -> ExportManifest | None:
    """The directory's export record; None where there is none or it is not one (a file of that name that does not
    parse is the user's, not ours)."""
    path = Path(directory) / MANIFEST_NAME
    try:
        raw = json.loads(path.read_text())
        manifest = ExportManifest(**raw)
    except (OSError, UnicodeDecodeError, ValueError, TypeError):
        return None
    # Only relative paths inside the directory count: an export removes what its record lists.
    valid = (isinstance(manifest.files, list)
             and all(isinstance(f, str) and f and not Path(f).is_absolute() and ".." not in Path(f).parts
                     for f in manifest.files)
             and isinstance(manifest.source_id, str)
             and (manifest.train_seq_len is None or isinstance(manifest.train_seq_len, int))
             and (manifest.data is None or isinstance(manifest.data, dict)))
    return manifest if valid else None


def shareable_data(data: dict | None) -> dict | None:
    """A run's data settings as the record keeps them (MACHINE_DATA_KEYS left out)."""
    return None if not data else {k: v for k, v in data.items() if k not in MACHINE_DATA_KEYS}


def recorded_train_seq_len(directory: str | Path) -> int | None:
    """T as the export of this directory recorded it (None where no export record says)."""
    manifest = read_manifest(directory)
    return manifest.train_seq_len if manifest is not None else None


def recorded_data(directory: str | Path) -> dict | None:
    """The data settings of the run the export of this directory came from (None where no export record says)."""
    manifest = read_manifest(directory)
    return manifest.data if manifest is not None else None


__all__ = ["MACHINE_DATA_KEYS", "MANIFEST_NAME", "ExportManifest", "read_manifest", "recorded_data",
           "recorded_train_seq_len", "shareable_data", "source_id"]
