"""A local source's documents in file order, from any row on: what tokenize='needed' reads, without `datasets`.

`datasets` prepares a whole source (an Arrow copy of every row) before the first row can be read; a run that reads
1% of a Pile shard must not wait for that. These readers stream the files instead, so the token cache can stop
where the run stops reading and continue from there later. Rows are what `datasets` would give, in the same order:
JSON lines (blank lines skipped), parquet rows, one .txt / .md file per document (undecodable bytes as U+FFFD).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from recurlen.training.data.compressed import open_file, reading
from recurlen.training.data.config import DataConfig
from recurlen.training.data.sources import Source

Row = tuple[Any, Any]
"""(text, id): the document's text and what decides its held-out membership (the text itself without id_field)."""


def _json_lines(path: Path, source: str) -> bool:
    """A .json file holding one object per line (not one JSON array)."""
    with reading(source, path), open_file(path) as f:
        head = f.read(4096).lstrip()
    return not head.startswith(b"[")


def readable(source: Source) -> bool:
    """Whether these readers can stream the source (local JSON lines, parquet or text files, not lz4)."""
    if source.kind != "files" or source.builder not in ("json", "parquet", "text"):
        return False
    if any(f.name.lower().endswith(".lz4") for f in source.files):
        return False
    return source.builder != "json" or all(_json_lines(f, source.location) for f in source.files
                                              if f.stat().st_size > 0)


def iter_rows(source: Source, cfg: DataConfig, *, skip: int = 0) -> Iterator[Row]:
    """Every row of the source in file order, from row `skip` on (earlier rows are passed over, not parsed)."""
    seen = 0
    for path in source.files:
        if path.stat().st_size == 0:
            continue
        if source.builder == "text":
            if seen >= skip:
                text = path.read_bytes().decode("utf-8", errors="replace")
                yield text, text
            seen += 1
        elif source.builder == "parquet":
            yield from _parquet_rows(path, cfg, skip=max(0, skip - seen))
            import pyarrow.parquet as pq

            seen += pq.ParquetFile(path).metadata.num_rows
        else:
            with reading(cfg.source, path), open_file(path) as f:
                for line_no, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    if seen >= skip:
                        yield _json_row(line, cfg, path, line_no)
                    seen += 1


def _json_row(line: bytes, cfg: DataConfig, path: Path, line_no: int) -> Row:
    try:
        row = json.loads(line)
    except ValueError as err:
        raise ValueError(f"source={cfg.source!r}: {path.name} line {line_no} is not JSON ({err}); fix or remove "
                         "the file") from None
    if not isinstance(row, dict) or cfg.text_field not in row or (cfg.id_field and cfg.id_field not in row):
        fields = sorted(row) if isinstance(row, dict) else type(row).__name__
        missing = cfg.text_field if not isinstance(row, dict) or cfg.text_field not in row else cfg.id_field
        raise ValueError(f"{'text_field' if missing == cfg.text_field else 'id_field'}={missing!r} is not a field "
                         f"of source={cfg.source!r} ({path.name} line {line_no}); its fields: {fields}")
    text = row[cfg.text_field]
    return text, row[cfg.id_field] if cfg.id_field else text


def _parquet_rows(path: Path, cfg: DataConfig, *, skip: int) -> Iterator[Row]:
    import pyarrow.parquet as pq

    file = pq.ParquetFile(path)
    columns = [c for c in dict.fromkeys((cfg.text_field, cfg.id_field)) if c]
    names = file.schema_arrow.names
    for name, value in (("text_field", cfg.text_field), ("id_field", cfg.id_field)):
        if value and value not in names:
            raise ValueError(f"{name}={value!r} is not a field of source={cfg.source!r}; its fields: {names}")
    start = 0
    for group in range(file.num_row_groups):
        rows = file.metadata.row_group(group).num_rows
        if start + rows <= skip:  # a row group before the first row wanted is not even read
            start += rows
            continue
        table = file.read_row_group(group, columns=columns)
        texts = table.column(cfg.text_field).to_pylist()
        keys = table.column(cfg.id_field).to_pylist() if cfg.id_field else texts
        for i in range(max(0, skip - start), rows):
            yield texts[i], keys[i]
        start += rows


__all__ = ["Row", "iter_rows", "readable"]
