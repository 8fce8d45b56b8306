"""PartitionReader: the rows a partition of a table holds at a version, read from its data files and kept in
memory (Delta data files never change once written). Reads go through pyarrow's parquet reader file by
file, never its dataset scanner (sparkbus.storage's docstring says why).

On an object store a file costs a request, so the files a read needs and does not hold are fetched all at
once (concurrent GETs: one round trip for any number of files), and the bytes of files fetched or written
lately are kept in a small cache the process's readers share (sparkbus.storage.fetched): a receive reads a
file narrow to choose what to lock and then whole for what it locked, one GET for both, and a file this
process committed costs none."""
from __future__ import annotations

import functools
import os
from collections import OrderedDict
from typing import Hashable, Iterable, Optional, TypeVar
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..core.records import conformed, nulls
from ..exceptions import PartitionUnavailableError
from . import PARTITION_COLUMN, location
from .commits import LogView
from .fetched import fetch, rows_written

K = TypeVar("K", bound=Hashable)
# Local data files up to this size are read with one call and parsed from memory (_small_local_file); a
# reader of a few columns does so up to NARROW_FILE_BYTES only: read by path, a narrow read of a larger file
# reads its narrow columns alone (a file of 1,000 messages: 53 us by path, 87 us read at once; 240: 51, 54).
SMALL_FILE_BYTES = 4 << 20
NARROW_FILE_BYTES = 256 << 10


@functools.lru_cache(maxsize=1 << 16)
def data_file(table_uri: str, path: str) -> str:
    """Where a data file named in a table's log (its path as there: relative, URL-quoted) is: a receive
    names each file of the partitions it visits, a few dozen, at every call."""
    return location.join(table_uri, unquote(path))


class PartitionReader:
    """Reads the rows one partition of a table holds at the table object's version, from its data files,
    keeping decoded files in memory: Delta data files never change once written, so a cached file is
    never stale, and after the first read only the files committed since are read (a few small ones
    per operation instead of a DataFusion query over all of them). Least recently used files are
    dropped beyond max_bytes. Files are read whole, single-threaded, without pyarrow's dataset
    scanner (see the module docstring). Given `columns`, only those (and the partition column) are read
    and returned: choosing what to lock needs a few narrow columns, not the bodies."""

    def __init__(self, schema: pa.Schema, max_bytes: int = 256 << 20,
                 columns: Optional[tuple[str, ...]] = None, narrow: "Optional[PartitionReader]" = None, *,
                 written: bool = False) -> None:
        """narrow: a reader of some columns of the same table; of a file that one holds, this reader takes
        those columns from it and decodes only the others. A receive chooses from a few narrow columns of
        every file of the partitions it visits and reads whole only the files holding what it locks: with
        the files read whole to choose, four receivers of one queue each decoded the bodies of what the
        others took (a 4-process receive spent 42% of its time in Parquet), and decoding the narrow columns
        twice cost a tenth of a batch receive in one process. written: take the rows of files this process
        wrote lately instead of reading them (compaction's reader: sparkbus.storage.fetched)."""
        if columns is not None:
            schema = pa.schema([f for f in schema if f.name == PARTITION_COLUMN or f.name in columns])
        self._narrow = narrow
        self._few_columns = columns is not None
        self._schema = schema
        self._file_schema = pa.schema([f for f in schema if f.name != PARTITION_COLUMN])
        self._partition_at = schema.get_field_index(PARTITION_COLUMN)
        self._max_bytes = max_bytes
        self._files: OrderedDict[str, pa.Table] = OrderedDict()
        # the Parquet footers of files this reader read, kept as long as their rows when another reader
        # takes columns from it (narrow): that one opens the file without parsing its footer again (a
        # fifth of its read)
        self._footers: dict[str, pq.FileMetaData] = {}
        self._lends = False
        self._written = written
        if narrow is not None:
            narrow._lends = True
        self._bytes = 0

    def rows(self, view: "LogView", partition: int, skip: Optional[list[bool]] = None) -> pa.Table:
        """Every row of the partition at the view's version (in the schema given, file by file); skip: per
        file of view.files(partition), whether to leave it out (unread)."""
        return self.with_partition([data for _, data in self.files(view, partition, skip=skip)], partition)

    def rows_of(self, view: "LogView", partition: int, sequence_numbers: pa.Array) -> pa.Table:
        """The partition's rows of these sequence numbers, in their order, read only from the files whose
        range may hold them (all must exist: KeyError naming one that does not)."""
        if not len(sequence_numbers):
            return self.with_partition([], partition)
        wanted = sequence_numbers.to_numpy(zero_copy_only=False)
        parts = [part for _, data in self.files(view, partition, int(wanted.min()), int(wanted.max()))
                 if (part := _rows_among(data, wanted)).num_rows]
        parts.sort(key=lambda part: part["sequence_number"][0].as_py())  # the files' ranges in order: no take
        found = self.with_partition(parts, partition)
        order = pc.index_in(sequence_numbers, value_set=found["sequence_number"])
        if order.null_count:
            raise KeyError(f"sequence number {sequence_numbers.filter(pc.is_null(order))[0]} is not in partition "
                           f"{partition} at version {view.version}")
        positions = order.to_numpy(zero_copy_only=False)
        if np.array_equal(positions, np.arange(len(positions))):  # asked for in the files' order: no copy
            return found
        return found.take(order)

    def with_partition(self, parts: list[pa.Table], partition: int) -> pa.Table:
        """File rows (without the partition column) as one table in the schema given."""
        data = parts[0] if len(parts) == 1 else pa.concat_tables(parts) if parts else self._file_schema.empty_table()
        field = self._schema.field(self._partition_at)
        column = pa.array(np.full(data.num_rows, partition, dtype=field.type.to_pandas_dtype()), field.type)
        return data.add_column(self._partition_at, field, column)  # the schema's order: files hold the others in it

    def files(self, view: "LogView", partition: int, low: Optional[int] = None,
              high: Optional[int] = None, skip: Optional[list[bool]] = None) -> list[tuple[str, pa.Table]]:
        """(path as in the log, rows without the partition column) of the partition's data files at the
        view's version, only those that may hold sequence numbers in [low, high] when given, and not those
        skip (one flag per file of view.files(partition)) leaves out. PartitionUnavailableError when one
        cannot be read."""
        try:
            listed = view.files(partition, low, high)
            if skip is not None:
                listed = [f for f, left_out in zip(listed, skip) if not left_out]
            paths = [(f.path, data_file(view.log.uri, f.path)) for f in listed]
            self._load([full for _, full in paths])
            return [(path, self._file(full)) for path, full in paths]
        except (OSError, pa.ArrowException) as error:  # missing, unreadable or corrupt: the partition's fault
            raise _fault(view, partition, error) from error

    def named(self, view: "LogView", paths: list[str]) -> list[pa.Table]:
        """The rows (without the partition column) of the view's data files at these paths (as in the log),
        those not in memory fetched together. OSError or pyarrow's error when one cannot be read."""
        full = [data_file(view.log.uri, path) for path in paths]
        self._load(full)
        return [self._file(path) for path in full]

    def merged(self, view: "LogView", paths: dict[K, list[str]]) -> dict[K, pa.Table]:
        """The rows of the view's data files at these paths (a group, e.g. a partition -> paths as in the
        log), each group's as one table in the schema given, those not in memory fetched together. The rows of
        files this process wrote lately (written) are taken as they were written and filled out with
        nulls in one call per partition, not file by file: compaction merging a single send's files
        spent 13 ms of Python on them, holding the GIL that the sends waited for. OSError or pyarrow's
        error when one cannot be read."""
        full = {p: [data_file(view.log.uri, path) for path in listed] for p, listed in paths.items()}
        parts: dict[str, pa.Table] = {}
        for path in (path for listed in full.values() for path in listed):
            kept = self._files.get(path)
            if kept is None and self._written:
                kept = rows_written(path)
            if kept is not None:
                parts[path] = kept
        self._load([path for listed in full.values() for path in listed if path not in parts])
        found = {}
        for p, listed in full.items():
            table = pa.concat_tables([parts[path] if path in parts else self._file(path) for path in listed],
                                     promote_options="default")
            found[p] = table if table.schema == self._file_schema else _as_schema(table, self._file_schema)
        return found

    def prefetch(self, view: "LogView", partitions: Iterable[int]) -> None:
        """Load the files of these partitions not in memory yet, all at once (on an object store, concurrent
        GETs); a partition whose files cannot be fetched is left for files() to report. Nothing to do on a
        local disk, where files() reads what it lacks (a read costs no round trip)."""
        if location.is_local(view.log.uri):
            return
        paths = [data_file(view.log.uri, f.path) for p in partitions for f in view.files(p)]
        try:
            self._load(paths)
        except (OSError, pa.ArrowException):
            pass

    def missing(self, view: "LogView", partitions: Iterable[int]) -> list[str]:
        """The object-store files of these partitions at the view's version that this reader does not hold."""
        if location.is_local(view.log.uri):
            return []
        paths = [data_file(view.log.uri, f.path) for p in partitions for f in view.files(p)]
        return [path for path in paths if path not in self._files]

    def _load(self, paths: list[str]) -> None:
        """Parse the object-store files among paths not in memory, fetched together."""
        missing = [path for path in paths if path not in self._files and not location.is_local(path)]
        if len(missing) > 1:
            for path, data in fetch(missing).items():
                self._file(path, data)

    def remember(self, path: str, data: pa.Table) -> None:
        """Keep the rows of a data file this process just wrote (path as files() names it, data without the
        partition column): the next read of that file costs nothing."""
        self._keep(path, conformed(data, self._file_schema))

    def _file(self, path: str, content: Optional[bytes] = None) -> pa.Table:
        cached = self._files.get(path)
        if cached is not None:
            self._files.move_to_end(path)
            return cached
        held = self._narrow._files.get(path) if self._narrow is not None else None
        wanted = self._file_schema.names if held is None else \
            [name for name in self._file_schema.names if name not in held.schema.names]
        if content is None:
            content = fetch([path])[path] if not location.is_local(path) else \
                _small_local_file(path, NARROW_FILE_BYTES if self._few_columns else SMALL_FILE_BYTES)
        footer = self._narrow._footers.get(path) if held is not None and self._narrow is not None else None
        # pre_buffer off: its coalesced reads pay off on high-latency files, not on a local file or bytes
        # already fetched, where it cost a third of a narrow read (466 -> 311 us for a file of 248 rows)
        file = pq.ParquetFile(path if content is None else pa.BufferReader(content), metadata=footer,
                              pre_buffer=False)
        present = set(file.schema_arrow.names)
        data = file.read([n for n in wanted if n in present], use_threads=False)
        if held is not None:  # the same file's rows, in the same order
            data = pa.Table.from_arrays([*held.columns, *data.columns], names=[*held.schema.names, *data.schema.names])
        if data.schema != self._file_schema:  # a file lacks the columns it holds no value of: they read as null
            data = _as_schema(data, self._file_schema)
        self._keep(path, data)
        if self._lends and path in self._files:
            self._footers[path] = file.metadata
        return data

    def _keep(self, path: str, data: pa.Table) -> None:
        """Cache a file's rows, dropping the least recently used beyond max_bytes (the memory their buffers
        hold: counted in microseconds where Table.nbytes took 23 us for a row)."""
        if path in self._files:
            return
        self._files[path] = data
        self._bytes += data.get_total_buffer_size()
        while self._bytes > self._max_bytes and len(self._files) > 1:
            gone, dropped = self._files.popitem(last=False)
            self._footers.pop(gone, None)
            self._bytes -= dropped.get_total_buffer_size()


def _small_local_file(path: str, limit: int) -> Optional[bytes]:
    """A local data file's bytes, read with one call, when it holds at most limit bytes (None: read it by
    path). pyarrow reads a file named by its path column chunk by column chunk, each a system call
    after the path's file system is resolved: a file of 248 messages read whole took 215 us that way and
    94 us read at once and parsed from memory."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(descriptor).st_size
        if size > limit:
            return None
        chunks, left = [], size
        while left:
            chunk = os.read(descriptor, left)
            if not chunk:  # (a data file never shrinks: only a broken one ends early, and its parse fails)
                break
            chunks.append(chunk)
            left -= len(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    finally:
        os.close(descriptor)


def _as_schema(data: pa.Table, schema: pa.Schema) -> pa.Table:
    """A file's rows in the table's schema: a column the file lacks (left out as empty, or added to the
    table since the file was written) as nulls; cast only where a type differs (files of older versions)."""
    present = dict(zip(data.schema.names, data.columns))
    columns = [column if (column := present.get(name)) is not None else nulls(data.num_rows, kind)
               for name, kind in zip(schema.names, schema.types)]
    try:
        return pa.Table.from_arrays(columns, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.table(columns, names=schema.names).cast(schema)


def _rows_among(data: pa.Table, wanted: np.ndarray) -> pa.Table:
    """The file's rows whose sequence numbers are among wanted, in the file's order: a slice (the bodies not
    copied) when they are consecutive rows, as a receive's oldest messages mostly are."""
    at = np.flatnonzero(np.isin(data["sequence_number"].to_numpy(), wanted))
    if at.size and at[-1] - at[0] == at.size - 1:
        return data.slice(int(at[0]), int(at.size))
    return data.take(pa.array(at, pa.int64()))


def _fault(view: "LogView", partition: int, error: BaseException) -> PartitionUnavailableError:
    """The error of a partition whose files are missing, unreadable or corrupt."""
    fault = PartitionUnavailableError(f"partition {partition} of {view.log.uri} cannot be read: {error}")
    fault.partition_id = partition
    return fault


def prefetch_together(reads: Iterable[tuple[PartitionReader, LogView, Iterable[int]]],
                      lazily: Iterable[PartitionReader] = ()) -> None:
    """PartitionReader.prefetch of each (reader, view, partitions), the files all of them lack fetched in one
    round trip (one after another, three readers paid three). The files of a reader in lazily are fetched
    but parsed only when read: a receive chooses from the message files its locks rows say may hold
    something to take (sparkbus.core.transitions.settled), and reads them from the process's fetched
    bytes (sparkbus.storage.fetched) without another request."""
    listed = [(reader, view, list(partitions)) for reader, view, partitions in reads]
    try:
        fetch([path for reader, view, partitions in listed for path in reader.missing(view, partitions)])
    except OSError:  # a file that cannot be fetched is left for files() to report
        pass
    later = set(map(id, lazily))
    for reader, view, partitions in listed:
        if id(reader) not in later:
            reader.prefetch(view, partitions)
