"""Where documents come from: resolve `DataConfig.source` and open it with `datasets`.

Kinds of source:
    embedded   the Python stdlib's .py files (see embedded.py; read as bytes, no `datasets` involved)
    files      local .txt / .json / .jsonl / .parquet / .csv files: one path, a glob, or a directory
    disk       a directory written by `Dataset.save_to_disk` / `DatasetDict.save_to_disk`
    hf         'hf:<name>' loaded with `datasets.load_dataset` (local HF cache, or the hub when online)
"""

from __future__ import annotations

import glob
import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recurlen.training.data import compressed, embedded
from recurlen.training.data.config import DataConfig

log = logging.getLogger(__name__)

# File suffix -> `datasets` packaged builder. Text files are one document per file.
BUILDERS = {".txt": "text", ".text": "text", ".md": "text", ".json": "json", ".jsonl": "json",
            ".ndjson": "json", ".parquet": "parquet", ".csv": "csv"}
COMPRESSION_SUFFIXES = (".gz", ".bz2", ".xz", ".zst", ".lz4")
SAVED_DATASET_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")
GLOB_CHARS = set("*?[")


@dataclass(frozen=True)
class Source:
    kind: str
    """'embedded' | 'files' | 'disk' | 'hf'."""
    location: str
    """The path, glob or dataset name as given."""
    builder: str | None = None
    """`datasets` builder for local files ('text', 'json', 'parquet', 'csv')."""
    files: tuple[Path, ...] = ()


def resolve_source(cfg: DataConfig) -> Source:
    """Decide what kind of source cfg.source is and find its files; FileNotFoundError when nothing is there."""
    spec = cfg.source
    if spec == "embedded":
        return Source("embedded", spec)
    if spec.startswith("hf:"):
        return Source("hf", spec[3:].strip())
    if GLOB_CHARS & set(spec):
        files = sorted(Path(p) for p in glob.glob(os.path.expanduser(spec), recursive=True) if os.path.isfile(p))
        if not files:
            raise FileNotFoundError(f"source={spec!r}: no files match this glob")
        return _files_source(spec, files)
    path = Path(spec).expanduser()
    if path.is_file():
        return _files_source(spec, [path])
    if path.is_dir():
        if any((path / marker).is_file() for marker in SAVED_DATASET_MARKERS):
            return Source("disk", spec, files=tuple(sorted(p for p in path.rglob("*") if p.is_file())))
        files = sorted(p for p in path.rglob("*") if p.is_file() and _builder_for(p) is not None
                       and not any(part.startswith(".") for part in p.relative_to(path).parts))
        if not files:
            raise FileNotFoundError(f"source={spec!r}: the directory holds no saved dataset and no files with "
                                    f"suffixes {sorted(BUILDERS)}")
        return _files_source(spec, files)
    raise FileNotFoundError(f"source={spec!r}: no such file or directory; allowed: 'embedded', a path or glob of "
                            f"{sorted(BUILDERS)} files, a save_to_disk directory, or 'hf:<name>'")


def _builder_for(path: Path) -> str | None:
    name = path.name.lower()
    for suffix in COMPRESSION_SUFFIXES:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return BUILDERS.get(Path(name).suffix)


def _files_source(spec: str, files: list[Path]) -> Source:
    builders = {f: _builder_for(f) for f in files}
    unknown = [str(f) for f, b in builders.items() if b is None]
    if unknown:
        raise ValueError(f"source={spec!r}: cannot read {unknown[:3]} (unknown suffix); allowed suffixes: "
                         f"{sorted(BUILDERS)}, optionally compressed {list(COMPRESSION_SUFFIXES)}")
    kinds = sorted(set(builders.values()))
    if len(kinds) > 1:
        raise ValueError(f"source={spec!r} mixes file formats {kinds}; point it at files of one format")
    return Source("files", spec, builder=kinds[0], files=tuple(f.resolve() for f in files))


def source_fingerprint(source: Source, cfg: DataConfig) -> dict[str, Any]:
    """Everything that decides the token cache's content, so a changed source never reuses a stale cache."""
    info: dict[str, Any] = {"kind": source.kind, "location": source.location, "max_documents": cfg.max_documents}
    if source.kind == "embedded":
        info["files"] = embedded.sources_fingerprint(
            embedded.list_stdlib_sources(max_documents=cfg.max_documents))
        return info
    info.update(text_field=cfg.text_field, id_field=cfg.id_field, streaming=cfg.streaming)
    if source.kind == "hf":
        info.update(config=cfg.hf_config, split=cfg.split)
    else:
        digest = hashlib.sha256()
        for path in source.files:
            stat = path.stat()
            digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
        info["files"] = digest.hexdigest()[:16]
        if source.kind == "disk":
            info["split"] = cfg.split
    return info


def open_dataset(source: Source, cfg: DataConfig) -> Any:
    """A `datasets.Dataset` (or `IterableDataset` when streaming) with at most cfg.max_documents rows.

    Only the text / id columns are checked here for non-streamed data; a streamed dataset is checked
    on its first batch (its columns may be unknown until then).
    """
    import datasets

    if source.kind == "files":
        # datasets' json builder dies with a bare StopIteration on a zero-byte file, so those are left out.
        files = [str(f) for f in source.files if f.stat().st_size > 0]
        if not files:
            raise ValueError(f"source={cfg.source!r} is empty: its {len(source.files)} file(s) hold no bytes")
        # Text files: a file is a document; undecodable bytes become U+FFFD rather than an error.
        kwargs = dict(sample_by="document", keep_linebreaks=True, encoding_errors="replace") \
            if source.builder == "text" else {}
        quiet = logging.getLogger("datasets")  # its own error log would repeat the cause reported below
        level = quiet.level
        quiet.setLevel(logging.CRITICAL)
        try:
            ds = datasets.load_dataset(source.builder, data_files=files, split="train", streaming=cfg.streaming,
                                       cache_dir=str(cfg.cache_root / "hf-datasets"), **kwargs)
        except Exception as err:
            # A file that does not decompress fails inside datasets with the decompressor's error alone (no file
            # named, no DatasetsError around it): which file it is, is found by decompressing each.
            found = compressed.find_damaged(cfg.source, [Path(f) for f in files])
            if found is not None:
                raise found from err
            if not isinstance(err, datasets.exceptions.DatasetsError | StopIteration):
                raise
            raise ValueError(f"source={cfg.source!r}: datasets could not read these {source.builder} files: "
                             f"{_innermost(err)}; fix or remove the file(s)") from err
        finally:
            quiet.setLevel(level)
    elif source.kind == "disk":
        ds = datasets.load_from_disk(source.location)
        if isinstance(ds, datasets.DatasetDict):
            if cfg.split not in ds:
                raise ValueError(f"source={source.location!r} is a DatasetDict without split={cfg.split!r}; "
                                 f"its splits: {sorted(ds)}")
            ds = ds[cfg.split]
    elif source.kind == "hf":
        try:
            ds = datasets.load_dataset(source.location, cfg.hf_config, split=cfg.split, streaming=cfg.streaming)
        except (FileNotFoundError, ValueError, ConnectionError) as err:
            raise ValueError(f"source='hf:{source.location}' (config={cfg.hf_config!r}, split={cfg.split!r}) could "
                             f"not be loaded: {err}. Offline, the dataset must already be in the Hugging Face "
                             "cache (set HF_HUB_OFFLINE=1 to use it without network).") from err
    else:
        raise AssertionError(f"open_dataset cannot open a {source.kind!r} source")

    if isinstance(ds, datasets.IterableDataset):
        if cfg.max_documents is None:
            log.warning("streaming source=%r without max_documents: the cache build reads the whole stream",
                        cfg.source)
        return ds.take(cfg.max_documents) if cfg.max_documents is not None else ds
    check_columns(list(ds.column_names), cfg)
    if len(ds) == 0:
        raise ValueError(f"source={cfg.source!r} is empty: it has no documents")
    if cfg.max_documents is not None and cfg.max_documents < len(ds):
        ds = ds.select(range(cfg.max_documents))
    return ds


def _innermost(err: BaseException) -> str:
    """The first line of the error at the bottom of the chain (what was wrong with the file, not which layer
    noticed)."""
    seen = [err]
    while (nxt := seen[-1].__cause__ or seen[-1].__context__) is not None and nxt not in seen:
        seen.append(nxt)
    for e in reversed(seen):
        text = str(e).strip()
        if text:
            return text.splitlines()[0]
    return type(err).__name__


def check_columns(columns: list[str], cfg: DataConfig) -> None:
    for name, value in (("text_field", cfg.text_field), ("id_field", cfg.id_field)):
        if value is not None and value not in columns:
            raise ValueError(f"{name}={value!r} is not a field of source={cfg.source!r}; its fields: {columns}")


__all__ = ["BUILDERS", "Source", "check_columns", "open_dataset", "resolve_source", "source_fingerprint"]
