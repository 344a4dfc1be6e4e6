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
FIELD_CHECK_ROWS = 1000
"""A JSON-lines source whose first this many rows (all of them, when it has fewer) lack text_field is refused: the
field is misspelt, as tokenize='all' says of a column that no row has. A row here and there without it is a document
without text, dropped and counted as tokenize='all' drops it (datasets reads a missing field as null)."""


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
    probe: tuple | None = () if skip == 0 else None  # a read from the start checks the field (FIELD_CHECK_ROWS)
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
                        row = _json_row(line, cfg, path, line_no)
                        if probe is not None:  # the source's first rows: is text_field a field of it at all?
                            probe = _probe(probe, row, cfg, path, line_no)
                        text = row.get(cfg.text_field)  # a row without it: no text, as a null one
                        yield text, row[cfg.id_field] if cfg.id_field else text
                    seen += 1
    if probe:  # the source ended before any of its rows had the field
        _refuse_field(cfg, *probe)


def _json_row(line: bytes, cfg: DataConfig, path: Path, line_no: int) -> dict:
    try:
        row = json.loads(line)
    except ValueError as err:
        raise ValueError(f"source={cfg.source!r}: {path.name} line {line_no} is not JSON ({err}); fix or remove "
                         "the file") from None
    if not isinstance(row, dict):
        _refuse_field(cfg, path, line_no, type(row).__name__, 1)
    if cfg.id_field and cfg.id_field not in row:
        raise ValueError(f"id_field={cfg.id_field!r} is not a field of source={cfg.source!r} ({path.name} line "
                         f"{line_no}); its fields: {sorted(row)}")
    return row


def _probe(probe: tuple, row: dict, cfg: DataConfig, path: Path, line_no: int) -> tuple | None:
    """None once a row has text_field; else (the first row's file, line and fields, the rows without it so far)."""
    if cfg.text_field in row:
        return None
    path, line_no, fields, rows = probe or (path, line_no, sorted(row), 0)
    if rows + 1 >= FIELD_CHECK_ROWS:
        _refuse_field(cfg, path, line_no, fields, rows + 1)
    return path, line_no, fields, rows + 1


def _refuse_field(cfg: DataConfig, path: Path, line_no: int, fields: Any, rows: int) -> None:
    more = f" and the {rows - 1} rows after it" if rows > 1 else ""
    raise ValueError(f"text_field={cfg.text_field!r} is not a field of source={cfg.source!r} ({path.name} line "
                     f"{line_no}{more}); its fields: {fields}")


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


def row_place(source: Source, cfg: DataConfig, row: int) -> str:
    """Where row `row` (0: the first; blank lines are no rows) of a source is: '<file> line N' in JSON lines, '<file>
    row N' in parquet, the file of a text source, 'row N' in any other (a hub or saved dataset, a JSON array, csv)."""
    if source.kind != "files" or source.builder not in ("json", "parquet", "text"):
        return f"row {row + 1}"
    seen = 0
    for path in (f for f in source.files if f.stat().st_size > 0):
        if source.builder == "text":
            if seen == row:
                return path.name
            seen += 1
        elif source.builder == "parquet":
            import pyarrow.parquet as pq

            rows = pq.ParquetFile(path).metadata.num_rows
            if row < seen + rows:
                return f"{path.name} row {row - seen + 1}"
            seen += rows
        elif not _json_lines(path, source.location):
            break
        else:
            with reading(source.location, path), open_file(path) as f:
                for line_no, line in enumerate(f, 1):
                    if line.strip():
                        if seen == row:
                            return f"{path.name} line {line_no}"
                        seen += 1
    return f"row {row + 1}"


__all__ = ["FIELD_CHECK_ROWS", "Row", "iter_rows", "readable", "row_place"]
