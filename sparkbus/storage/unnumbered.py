"""Data files written before their rows are numbered: Parquet files whose fixed-width columns (a bulk
send's sequence numbers and enqueue times) are filled in, in place, by the commit that adopts them.

Why: a bulk send's rows are made on Spark's executors, but their sequence numbers exist only once the
committing process knows each partition's last number, at the commit. Staging the rows and having the
committer write them again as Parquet wrote every byte twice (1 GB of bodies: the second write was about
a third of the send). Written here, each executor writes its rows once, as the table's own files, with
placeholders in the columns that depend on the commit; the commit overwrites those values (8 bytes a
row and column) and nothing else, and again with other values when it is planned again after a conflict.

The layout that makes that safe: no compression, no dictionaries, and one data page per column chunk
(rows per row group bounded, and pages large enough for them), so a chunk of an int64 column without nulls ends
with its values, little-endian, in row order, after the page header and any definition levels. The
filled columns carry no Parquet statistics (their placeholders would be wrong bounds: the Delta log's
statistics are computed from the filled values). fill checks that layout from the footer and by reading
the values both ways before writing, and reads them back after: a file that does not match is refused
(ValueError), never written into at a guessed place.
"""
from __future__ import annotations

import os
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..core.records import stored_int64s

ROW_GROUP_ROWS = 65_536  # rows a row group holds at most: one page of an int64 column is 512 KiB at most
ROW_GROUP_BYTES = 64 << 20  # Arrow bytes a row group holds at most
# A data page ends once it holds this much (Parquet's default): more than an int64 chunk of ROW_GROUP_ROWS
# values, so each of those is one page, while a body column is cut into pages of about this size (pages of
# a whole row group's bodies, 64 MB, made the executors' writes a fifth slower).
PAGE_BYTES = 1 << 20
_PLAIN = {"PLAIN", "RLE", "BIT_PACKED"}  # the encodings of a chunk written as options() says


def options(stats_columns: tuple[str, ...], filled: tuple[str, ...]) -> dict[str, object]:
    """How an unnumbered file is encoded: as a commit's own small files (no compression, no dictionaries,
    no copy of the Arrow schema), Parquet statistics on the stats columns that are not filled later, and
    one data page per column chunk."""
    return {"compression": "none", "use_dictionary": False, "store_schema": False,
            "write_statistics": [c for c in stats_columns if c not in filled],
            "data_page_size": PAGE_BYTES, "max_rows_per_page": ROW_GROUP_ROWS}


class Writer:
    """One unnumbered file, written as row groups of at most ROW_GROUP_ROWS rows and ROW_GROUP_BYTES: rows
    given to write() are held until a row group is full (or close())."""

    def __init__(self, path: str, schema: pa.Schema, stats_columns: tuple[str, ...], filled: tuple[str, ...]) -> None:
        self.path, self.rows = path, 0
        self._schema = schema
        self._writer = pq.ParquetWriter(path, schema, **options(stats_columns, filled))
        self._held: list[pa.Table] = []
        self._held_rows = self._held_bytes = 0

    def write(self, table: pa.Table) -> None:
        """Add rows (in the file's schema)."""
        self._held.append(table)
        self._held_rows += table.num_rows
        self._held_bytes += table.nbytes
        self.rows += table.num_rows
        if self._held_rows >= ROW_GROUP_ROWS or self._held_bytes >= ROW_GROUP_BYTES:
            self._flush()

    def close(self) -> None:
        """Write what is held and the footer."""
        self._flush()
        self._writer.close()

    def _flush(self) -> None:
        if not self._held_rows:
            return
        rows = pa.concat_tables(self._held)
        self._held, self._held_rows, self._held_bytes = [], 0, 0
        start = 0
        while start < rows.num_rows:  # each group within both bounds (one large table may exceed them)
            size = min(ROW_GROUP_ROWS, rows.num_rows - start)
            part = rows.slice(start, size)
            while size > 1 and part.nbytes > ROW_GROUP_BYTES:
                size //= 2
                part = rows.slice(start, size)
            self._writer.write_table(part, row_group_size=size)
            start += size


def fill(path: str, changes: dict[str, Callable[[np.ndarray], np.ndarray]]) -> dict[str, np.ndarray]:
    """Overwrite int64 (or microsecond timestamp) columns of the Parquet file at path in place: for each
    named column, changes[name] gets its current values (in row order) and returns the new ones. The file
    must be laid out as Writer writes it; returns the values written, read back from the file. Raises
    ValueError, before anything is written, when a column is not laid out so or holds nulls, and after,
    when the values read back are not those written (the file must then be discarded)."""
    file = pq.ParquetFile(path)
    metadata = file.metadata
    names = file.schema_arrow.names
    places: dict[str, list[tuple[int, int]]] = {name: [] for name in changes}  # (offset, rows) per row group
    for group in range(metadata.num_row_groups):
        rows = metadata.row_group(group).num_rows
        for name in changes:
            if name not in names:
                raise ValueError(f"{path}: no column {name!r} to fill")
            chunk = metadata.row_group(group).column(names.index(name))
            if chunk.physical_type != "INT64" or chunk.compression != "UNCOMPRESSED" or \
                    chunk.dictionary_page_offset is not None or not set(chunk.encodings) <= _PLAIN or \
                    chunk.num_values != rows or chunk.total_compressed_size < 8 * rows:
                raise ValueError(f"{path}: column {name!r} of row group {group} is not one plain, uncompressed "
                                 f"page of {rows} int64 values ({chunk.encodings}, {chunk.compression})")
            places[name].append((chunk.data_page_offset + chunk.total_compressed_size - 8 * rows, rows))
    current = _read(file, list(changes))
    descriptor = os.open(path, os.O_RDWR)
    try:
        for name, spots in places.items():
            if _raw(descriptor, spots).tolist() != current[name].tolist():
                raise ValueError(f"{path}: the values of column {name!r} are not where its layout puts them")
        wanted = {name: np.ascontiguousarray(change(current[name]), dtype="<i8") for name, change in changes.items()}
        for name, spots in places.items():
            if len(wanted[name]) != len(current[name]):
                raise ValueError(f"{path}: {len(wanted[name])} values for the {len(current[name])} rows of {name!r}")
            start = 0
            for offset, rows in spots:
                os.pwrite(descriptor, wanted[name][start:start + rows].tobytes(), offset)
                start += rows
    finally:
        os.close(descriptor)
    written = _read(pq.ParquetFile(path), list(changes))
    for name, values in wanted.items():
        if not np.array_equal(written[name], values):
            raise ValueError(f"{path}: column {name!r} does not read back as written")
    return written


def _read(file: pq.ParquetFile, names: list[str]) -> dict[str, np.ndarray]:
    """The columns' values as int64 (ValueError when one holds nulls)."""
    table = file.read(columns=names)
    found: dict[str, np.ndarray] = {}
    for name in names:
        column = table[name]
        if column.null_count:
            raise ValueError(f"column {name!r} holds nulls: only columns without them are filled")
        found[name] = np.asarray(stored_int64s(column), dtype=np.int64)
    return found


def _raw(descriptor: int, spots: list[tuple[int, int]]) -> np.ndarray:
    """The int64 values stored at these (offset, count) places, in order."""
    parts = []
    for offset, rows in spots:
        data = os.pread(descriptor, 8 * rows, offset)
        if len(data) != 8 * rows:
            raise ValueError("the file ends before its values")
        parts.append(np.frombuffer(data, dtype="<i8"))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

