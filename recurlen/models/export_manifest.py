"""recurlen_export.json: which files `recurlen export` wrote into a directory, and what it knew of the training.

An export directory may also hold the user's own files: a later export replaces (or removes, when it no longer
writes them) only the files listed here, and only when the record says the directory is an export of the same run.
What it records of the training, the context T, lets `recurlen eval DIR` measure an export in units of T without
being told T (load_model reads it).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

MANIFEST_NAME = "recurlen_export.json"
FORMAT = 1


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
             and (manifest.train_seq_len is None or isinstance(manifest.train_seq_len, int)))
    return manifest if valid else None


def recorded_train_seq_len(directory: str | Path) -> int | None:
    """T as the export of this directory recorded it (None where no export record says)."""
    manifest = read_manifest(directory)
    return manifest.train_seq_len if manifest is not None else None


__all__ = ["MANIFEST_NAME", "ExportManifest", "read_manifest", "recorded_train_seq_len", "source_id"]
