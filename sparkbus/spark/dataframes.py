"""Spark DataFrames as message batches (Spark-specific; the message API never imports this module).

send_dataframe: columns named like the ServiceBusMessage fields (body required, string or binary).
Executors complete the rows batch by batch in Arrow (message ids, encoded properties, and partition
placement by the same function as the Python path, partitioning.partition_codes). Into a local entity
without duplicate detection they also check the session and size rules and write the rows as the
messages table's own data files (storage.unnumbered), and the driver's one commit moves them into the
table and fills in their sequence numbers and enqueue times in place: every byte is written once (1 GB
of bodies: the driver's second write was about a third of the send). Elsewhere (an object store, which
cannot change a file in place; duplicate detection, decided against the table's history in the
committing process; rows that break a rule, whose error the staged path raises) they stage Arrow IPC
files in the namespace, and the driver memory-maps them and commits every row in one Delta commit with
gap-free sequence numbers, duplicate detection and per-row size checks, reading the rows there but not
collecting them through the JVM. Either way one commit makes every row visible at once, numbered gap-free
in the DataFrame's order within each partition (keyless rows: each Spark partition's in one file, placed
whole, before its keyed rows in the same partition).
placement_udf exposes the same placement as a Spark UDF for users' own DataFrames.
"""
from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Optional, Protocol, Sequence, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import storage
from ..core import partitioning, records, sequencing
from ..core.encoding import OUTGOING, STRING_PROPERTIES, body_sizes, header_sizes, new_message_ids
from ..core.values import encode_properties
from ..engine.enqueue import FILLED, EnqueueResult, Unnumbered, check_status, stored_rows
from ..storage import location, unnumbered
from .workers import workers_checked

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql._typing import UserDefinedFunctionLike
    from pyspark.sql.types import DataType, StructType

    from ..engine.enqueue import EntityWriter

CODE = "_sparkbus_partition_code"
STAGING_DIR = "_staging"  # under the namespace: executors and the driver both reach it
OPTIONAL_COLUMNS = (*STRING_PROPERTIES, "application_properties", "time_to_live", "scheduled_enqueue_time_utc")


def _property_spark_types() -> tuple[type[DataType], ...]:
    from pyspark.sql import types as T

    return (T.StringType, T.BooleanType, T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.FloatType,
            T.DoubleType, T.BinaryType, T.TimestampType, T.TimestampNTZType)


def placement_udf(requires_duplicate_detection: bool, partition_count: int) -> UserDefinedFunctionLike:
    """Pandas (Arrow) UDF (session_id, partition_key, message_id) -> placement code, per batch of rows.

    pandas is imported here, not with the module: Spark starts a fresh Python process for each planning step
    of a query on the sparkbus data source, each imports this module, and pandas took about a second of each."""
    import pandas as pd
    from pyspark.sql.pandas.functions import pandas_udf  # what pyspark.sql.functions re-exports

    def place(session_ids: pd.Series, keys: pd.Series, message_ids: pd.Series) -> pd.Series:
        def values(series: pd.Series) -> list[Optional[str]]:
            return [None if v is None or v != v else v for v in series.tolist()]

        return pd.Series(partitioning.partition_codes(values(session_ids), values(keys), values(message_ids),
                                                      requires_duplicate_detection, partition_count), dtype="int32")

    # the hints as objects: pandas_udf reads them with typing.get_type_hints, which looks names up in the module
    place.__annotations__ = {"session_ids": pd.Series, "keys": pd.Series, "message_ids": pd.Series,
                             "return": pd.Series}

    # pyspark's stub lacks pandas_udf(returnType) over a function with type hints, the form Spark documents
    udf: UserDefinedFunctionLike = pandas_udf("int")(place)  # type: ignore[call-overload]
    return udf


def check_dataframe(df: object, what: str) -> None:
    """TypeError unless df is a Spark DataFrame (classic or Spark Connect), naming what was given."""
    if not all(hasattr(df, name) for name in ("schema", "select", "mapInArrow")):
        pandas = type(df).__module__.startswith("pandas")
        hint = "; for a pandas DataFrame, spark.createDataFrame(pdf) first" if pandas else ""
        raise TypeError(f"{what} takes a Spark DataFrame, got {type(df).__name__}{hint}")


def check_columns(schema: "StructType") -> dict[str, DataType]:
    """The message columns of a DataFrame schema (send_dataframe and the streaming sink); ValueError or
    TypeError names what is wrong and what is allowed."""
    from pyspark.sql import types as T

    fields = {f.name: f.dataType for f in schema.fields}
    if "body" not in fields:
        raise ValueError(f"send_dataframe needs a 'body' column (string or binary); the DataFrame has {sorted(fields)}")
    unknown = sorted(set(fields) - {"body", *OPTIONAL_COLUMNS})
    if unknown:
        raise ValueError(f"unknown message column(s) {unknown}; allowed: body, {', '.join(OPTIONAL_COLUMNS)}")
    expected = {"body": (T.StringType, T.BinaryType), "time_to_live": (T.DayTimeIntervalType,),
                "scheduled_enqueue_time_utc": (T.TimestampType, T.TimestampNTZType),
                "application_properties": (T.MapType, T.StructType)}
    for name, dtype in fields.items():
        allowed = expected.get(name, (T.StringType,))
        if not isinstance(dtype, allowed):
            raise TypeError(f"column {name!r} has type {dtype.simpleString()}; expected "
                            f"{' or '.join(a.__name__.replace('Type', '').lower() for a in allowed)}")
    properties = fields.get("application_properties")
    kinds = "a string, boolean, integer, floating-point, binary or timestamp"
    for field in properties.fields if isinstance(properties, T.StructType) else ():
        if not isinstance(field.dataType, _property_spark_types()):
            raise TypeError(f"application property column {field.name!r} has type {field.dataType.simpleString()}; "
                            f"a property column is {kinds}")
    if isinstance(properties, T.MapType) and not (isinstance(properties.keyType, T.StringType)
                                                  and isinstance(properties.valueType, _property_spark_types())):
        raise TypeError(f"application_properties has type {properties.simpleString()}; a map of properties has "
                        f"string keys and values of one type, {kinds}")
    return fields


ALL_COLUMNS = "*"  # messages_from_dataset(property_columns=ALL_COLUMNS): every column not otherwise used
FIELD_COLUMNS = tuple(name for name in OPTIONAL_COLUMNS if name != "application_properties")


def messages_from_dataset(df: "DataFrame", body_column: "str | None" = None, *,
                          property_columns: "Sequence[str] | str" = (),
                          field_columns: "Mapping[str, str] | None" = None) -> "DataFrame":
    """A dataset's rows as message rows for send_dataframe.

    The body is body_column (default: a 'body' column if there is one, else each whole row as JSON text;
    a column that is not text or binary is sent as its text).
    A message field (subject, session_id, partition_key, time_to_live, scheduled_enqueue_time_utc, ...)
    comes from the column field_columns names for it, else from a column of its name. property_columns
    become application properties with their types (a row's null cells are left out); ALL_COLUMNS takes
    every column that is not the body or a field. time_to_live may be seconds (a number) and
    scheduled_enqueue_time_utc ISO 8601 text (UTC unless it names an offset). Raises ValueError naming a
    column the dataset lacks or a field that does not exist, TypeError for a column of the wrong type."""
    from pyspark.sql import functions as F, types as T

    names = df.columns
    chosen = dict(field_columns or {})
    unknown = sorted(set(chosen) - set(FIELD_COLUMNS))
    if unknown:
        raise ValueError(f"no message field(s) {unknown}; the fields a column can set: {', '.join(FIELD_COLUMNS)}")
    for name in FIELD_COLUMNS:
        if name not in chosen and name in names and name != body_column:
            chosen[name] = name
    used = {*chosen.values(), body_column or "body"}
    wanted = [n for n in names if n not in used] if property_columns == ALL_COLUMNS else list(property_columns)
    missing = [c for c in [body_column, *chosen.values(), *wanted] if c is not None and c not in names]
    if missing:
        raise ValueError(f"the dataset has no column(s) {missing}; its columns are {names}")
    if body_column is None and "body" not in names:
        body = F.to_json(F.struct(*[F.col(f"`{n}`") for n in names]))
    else:
        body = F.col(f"`{body_column or 'body'}`")
    types = {f.name: f.dataType for f in df.schema.fields}
    if not isinstance(types.get(body_column or "body", T.StringType()), (T.StringType, T.BinaryType)):
        body = body.cast("string")  # a number or date column (e.g. inferred from CSV) is sent as its text
    columns = [body.alias("body")]
    for field, column in chosen.items():
        value = F.col(f"`{column}`")
        if field == "time_to_live" and isinstance(types[column], T.NumericType):
            value = F.make_dt_interval(secs=value.cast("decimal(18,6)"))
        elif field == "scheduled_enqueue_time_utc" and isinstance(types[column], T.StringType):
            value = F.to_timestamp(value)
        columns.append(value.alias(field))
    if wanted:
        columns.append(F.struct(*[F.col(f"`{c}`").alias(c) for c in wanted]).alias("application_properties"))
    return df.select(*columns)


def _select(df: "DataFrame", fields: dict[str, DataType]) -> "DataFrame":
    """The message columns with Spark types that map onto OUTGOING (body as binary)."""
    from pyspark.sql import functions as F, types as T

    columns: list["Column"] = []
    body = F.col("body")
    columns.append((F.encode(body, "UTF-8") if isinstance(fields["body"], T.StringType) else body).alias("body"))
    for name in STRING_PROPERTIES:
        columns.append((F.col(f"`{name}`") if name in fields else F.lit(None).cast("string")).alias(name))
    for name in ("application_properties", "time_to_live", "scheduled_enqueue_time_utc"):
        if name in fields:
            columns.append(F.col(name))
    return df.select(*columns)


def complete_batch(batch: pa.RecordBatch, requires_duplicate_detection: bool, partition_count: int) -> pa.Table:
    """OUTGOING rows plus placement codes for one Arrow batch: missing message ids generated, typed
    properties encoded, durations in ms, and partitioning.partition_codes applied."""
    n = batch.num_rows
    if "body" in batch.schema.names and pa.types.is_string(batch.schema.field("body").type):
        batch = batch.set_column(batch.schema.get_field_index("body"), "body", pc.cast(batch.column("body"), pa.binary()))
    columns = {}
    for field in OUTGOING:
        present = field.name in batch.schema.names
        columns[field.name] = batch.column(field.name) if present else pa.nulls(n, field.type)
    if columns["message_id"].null_count:
        columns["message_id"] = pc.coalesce(columns["message_id"], new_message_ids(n))
    if "application_properties" in batch.schema.names:
        columns["application_properties"] = _encoded_properties(batch.column("application_properties"))
    if "time_to_live" in batch.schema.names:
        columns["time_to_live_ms"] = pc.divide(pc.cast(batch.column("time_to_live"), pa.int64()), 1000)
    rows = pa.table([pc.cast(columns[f.name], f.type) for f in OUTGOING], schema=OUTGOING)
    codes = partitioning.table_codes(rows, requires_duplicate_detection, partition_count)
    return rows.append_column(CODE, pa.array(codes, pa.int32()))


def _encoded_properties(column: "pa.Array | pa.ChunkedArray") -> pa.Array:
    """A map or struct column of application properties as their stored JSON texts, each distinct set of
    properties encoded once (a DataFrame's rows mostly repeat a few: encoding each row was most of a bulk
    send's conversion). Which rows repeat a set is found in Arrow (_set_codes), so Python sees only the
    distinct sets. A struct's null cells are no property."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    codes, first = _set_codes(column)
    struct = pa.types.is_struct(column.type)
    texts: list[Optional[str]] = []
    for cell in column.take(pa.array(first)).to_pylist():
        if cell is None:
            texts.append(None)
        else:
            texts.append(encode_properties({k: v for k, v in cell.items() if v is not None} if struct else dict(cell)))
    return pa.array(texts, pa.string()).take(pa.array(codes))


def _set_codes(column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(codes, first): rows with one code hold the same set of properties, and first[c] is a row of code c.
    Each row's key is its validity and its values' codes (_value_codes) in order (a map's keys and items),
    combined column by column and renumbered densely after each, so it stays below the row count squared.
    Equal keys mean equal sets: a map's values, and each struct field's, have one type (so 1 and True
    never meet), and 0.0 and -0.0 stay apart."""
    n = len(column)
    key = np.asarray(column.is_valid(), dtype=np.int64)
    if pa.types.is_struct(column.type):
        for field in column.flatten():
            key = _combined(key, _value_codes(field))
    else:
        offsets = column.offsets.to_numpy()
        lengths = np.diff(offsets)
        keys, items = _value_codes(column.keys), _value_codes(column.items)
        key = _combined(key, lengths)
        for length in np.unique(lengths[lengths > 0]).tolist():
            rows = np.flatnonzero(lengths == length)
            for i in range(length):
                for values in (keys, items):
                    part = np.zeros(n, dtype=np.int64)  # rows of another length share 0: their lengths differ
                    part[rows] = values[offsets[rows] + i]
                    key = _combined(key, part)
    codes = pc.dictionary_encode(pa.array(key)).indices.to_numpy()
    first = np.empty(int(codes.max()) + 1 if n else 0, dtype=np.int64)
    first[codes[::-1]] = np.arange(n - 1, -1, -1)  # (the last write wins: each code's first row)
    return codes, first


def _combined(key: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """key and codes (both from 0) as one dense code per row: equal exactly where both are equal."""
    joined = key * (int(codes.max(initial=0)) + 1) + codes
    return np.asarray(pc.dictionary_encode(pa.array(joined)).indices.to_numpy(), dtype=np.int64)


def _value_codes(values: pa.Array) -> np.ndarray:
    """A code per value, equal exactly where the values are (a null its own code). Arrow's hashing keeps
    0.0 and -0.0 apart (it compares floats by their bits, all NaNs as one: they encode alike)."""
    encoded = pc.dictionary_encode(values, null_encoding="encode")
    return np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64)


def write_staged(path: str, tables: Iterable[pa.Table]) -> bool:
    """Write tables as one Arrow IPC file at path: streamed to a local file, or put whole as one object on
    an object store. False (nothing written) when there were no tables."""
    local = location.is_local(path)
    buffer = None if local else pa.BufferOutputStream()
    sink, writer = (path if buffer is None else buffer), None
    for table in tables:
        if writer is None:
            if local:
                os.makedirs(os.path.dirname(path), exist_ok=True)
            writer = pa.ipc.new_file(sink, table.schema)
        writer.write_table(table)
    if writer is None:
        return False
    writer.close()
    if buffer is not None:
        location.put(path, buffer.getvalue().to_pybytes())
    return True


def read_staged(path: str) -> pa.Table:
    """A staged file's rows: memory-mapped when local, fetched whole from an object store."""
    source = pa.memory_map(path) if location.is_local(path) else pa.BufferReader(location.get(path))
    return pa.ipc.open_file(source).read_all()


def _stage(df: "DataFrame", staging: str, requires_duplicate_detection: bool, partition_count: int) -> list[str]:
    """Executors complete their rows and write them as Arrow IPC files under `staging`; returns the paths
    in the DataFrame's row order (by Spark partition).

    Conversion runs in parallel on the executors, and the driver memory-maps the files instead of
    collecting the rows through the JVM (1,000,000 rows of 1 KiB: 5.9 s against 8.7 s for toArrow). On an
    object store each file is written whole as one object, with the namespace's storage options shipped
    to the executors.
    """
    shipped = location.shipment(staging)

    def write(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        location.install(staging, *shipped)
        index = cast("TaskContext", TaskContext.get()).partitionId()  # never None: mapInArrow runs it in a task
        path = location.join(staging, f"{index:08d}-{uuid.uuid4().hex}.arrow")
        if write_staged(path, (complete_batch(b, requires_duplicate_detection, partition_count) for b in batches)):
            yield pa.RecordBatch.from_pydict({"position": [index], "path": [path]})

    with workers_checked(df.sparkSession):
        staged = df.mapInArrow(write, "position long, path string").collect()
    return [row.path for row in sorted(staged, key=lambda row: row.position)]


@dataclass(frozen=True)
class _Rules:
    """What an executor writing unnumbered files checks and places by (an entity's, shipped with the task)."""

    requires_session: bool
    max_header_bytes: int
    max_message_bytes: int
    partition_count: int
    unavailable: frozenset[int]
    default_ttl: timedelta

    def kept(self, rows: pa.Table, codes: np.ndarray, body: np.ndarray, header: np.ndarray) -> bool:
        """Whether rows keep the session, placement and size rules (the staged path raises what they break)."""
        if self.requires_session and rows["session_id"].null_count:
            return False
        pinned = codes[codes >= 0]
        if (codes == partitioning.KEY_MISMATCH).any() or (self.unavailable and np.isin(pinned, list(self.unavailable)).any()):
            return False
        return not ((header > self.max_header_bytes).any() or (body + header > self.max_message_bytes).any())


def _write_unnumbered(df: "DataFrame", staging: str, rules: _Rules,
                      stats_columns: tuple[str, ...]) -> Optional[list[Unnumbered]]:
    """Executors complete, check and place their rows and write them as the table's own data files under
    `staging` (storage.unnumbered: the commit fills in their numbers and times): per Spark partition, one
    file per entity partition its keyed rows go to and one of its keyless rows (partition KEYLESS, placed
    whole by the commit). Returns the files in the DataFrame's order, or None when some rows break a rule
    (the files are removed: the staged path then raises what they break, as it always has)."""
    from ..core.schemas import MESSAGES

    schema = pa.schema([f for f in MESSAGES if f.name != storage.PARTITION_COLUMN])

    def write(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        index = cast("TaskContext", TaskContext.get()).partitionId()  # never None: mapInArrow runs it in a task
        os.makedirs(staging, exist_ok=True)
        now = datetime.now(timezone.utc)
        writers: dict[int, unnumbered.Writer] = {}
        sizes: dict[int, list[int]] = {}
        kept = True
        try:
            for batch in batches:
                rows = complete_batch(batch, False, rules.partition_count)
                codes = np.asarray(rows[CODE].to_numpy(zero_copy_only=False), dtype=np.int32)
                rows = rows.drop_columns([CODE])
                body, header = body_sizes(rows), header_sizes(rows)
                if not rules.kept(rows, codes, body, header):
                    kept = False
                    break
                # keyless rows (code KEYLESS) go into one file, placed whole by the commit
                data = stored_rows(rows, np.maximum(codes, 0), np.zeros(len(codes), np.int64), body, header,
                                   now, rules.default_ttl).drop_columns([storage.PARTITION_COLUMN])
                for p in np.unique(codes).tolist():
                    mask = codes == p
                    if p not in writers:
                        path = location.join(staging, f"{index:08d}-{p:05d}-{uuid.uuid4().hex}.parquet")
                        writers[p], sizes[p] = unnumbered.Writer(path, schema, stats_columns, FILLED), [0, 0]
                    writers[p].write(data if mask.all() else data.filter(pa.array(mask)))
                    sizes[p][0] += int(body[mask].sum())
                    sizes[p][1] += int(header[mask].sum())
        finally:
            for written in writers.values():
                written.close()
            if not kept:
                for written in writers.values():
                    os.remove(written.path)
        if not kept:
            yield pa.RecordBatch.from_pydict({"position": [index], "partition": [0], "path": [""], "rows": [0],
                                              "body": [0], "header": [0], "at": [0], "kept": [False]})
            return
        ordered = sorted(writers)
        yield pa.RecordBatch.from_pydict({
            "position": [index] * len(ordered), "partition": ordered, "path": [writers[p].path for p in ordered],
            "rows": [writers[p].rows for p in ordered], "body": [sizes[p][0] for p in ordered],
            "header": [sizes[p][1] for p in ordered], "at": [records.micros(now)] * len(ordered),
            "kept": [True] * len(ordered)})

    with workers_checked(df.sparkSession):
        found = df.mapInArrow(write, "position long, partition long, path string, rows long, body long, "
                                     "header long, at long, kept boolean").collect()
    if not all(row.kept for row in found):
        for row in found:
            if row.kept:
                os.remove(row.path)
        return None
    return [Unnumbered(row.path, row.partition, row.rows, row.body, row.header, row.at)
            for row in sorted(found, key=lambda row: (row.position, row.partition))]


def send_dataframe(writer: "EntityWriter", df: "DataFrame") -> EnqueueResult:
    """Send every row of df in one atomic commit; returns counts and per-partition (first, last) numbers.

    Into a local entity without duplicate detection the executors write the table's data files themselves
    (_write_unnumbered) and the commit numbers them in place: each row is written once. Elsewhere (an
    object store, duplicate detection, rows that break a rule) they stage Arrow files that the committing
    process reads and writes as data files."""
    check_dataframe(df, "send_dataframe")
    fields = check_columns(df.schema)
    info = writer.info()
    check_status(info)
    staging = location.join(info.namespace.path, STAGING_DIR, uuid.uuid4().hex)
    try:
        if location.is_local(info.tables["messages"]) and location.is_local(staging) and \
                not info.options.requires_duplicate_detection:
            rules = _Rules(info.options.requires_session, info.max_header_bytes, info.max_message_bytes,
                           info.partition_count, frozenset(info.avoided()), info.options.default_message_time_to_live)
            files = _write_unnumbered(_select(df, fields), location.join(staging, "unnumbered"), rules,
                                      writer.stats_columns(info))
            if files is not None:
                return writer.append_unnumbered(files, info=info)
        paths = _stage(_select(df, fields), staging, info.options.requires_duplicate_detection,
                       info.partition_count)
        tables = [read_staged(p) for p in paths]
        if not tables:
            return EnqueueResult()
        staged = pa.concat_tables(tables)
        codes = np.asarray(staged[CODE].to_numpy(zero_copy_only=False), dtype=np.int32)
        return writer.append(staged.drop_columns([CODE]), codes=codes, batch_limit=False,
                             with_sequence_numbers=False, info=info)
    finally:
        storage.remove_tree(staging)


RECEIVED_COLUMNS = ("sequence_number", "message_id", "session_id", "partition_key", "correlation_id", "content_type",
                    "subject", "to", "reply_to", "reply_to_session_id", "body", "application_properties",
                    "enqueued_time_utc", "scheduled_enqueue_time_utc", "expires_at_utc", "delivery_count",
                    "lock_token", "locked_until_utc", "dead_letter_reason", "dead_letter_error_description")


class _ReceivedMessage(Protocol):
    """What messages_to_arrow reads of a received message (sparkbus.receiver.ServiceBusReceivedMessage, a
    layer above this one): the attributes RECEIVED_COLUMNS name, read by name, and these two."""

    @property
    def body_bytes(self) -> bytes: ...

    @property
    def str_application_properties(self) -> Optional[dict[str, Any]]: ...


RECEIVED_SPARK_SCHEMA = (
    "sequence_number long, message_id string, session_id string, partition_key string, correlation_id string, "
    "content_type string, subject string, `to` string, reply_to string, reply_to_session_id string, body binary, "
    "application_properties string, enqueued_time_utc timestamp, scheduled_enqueue_time_utc timestamp, "
    "expires_at_utc timestamp, delivery_count int, lock_token string, locked_until_utc timestamp, "
    "dead_letter_reason string, dead_letter_error_description string")


def messages_to_arrow(messages: Sequence[_ReceivedMessage]) -> pa.Table:
    """Received messages as Arrow rows (body as stored, application properties as their stored typed JSON)."""
    rows = []
    for m in messages:
        row = {name: getattr(m, name) for name in RECEIVED_COLUMNS if name not in ("body", "application_properties")}
        row["body"] = m.body_bytes
        row["application_properties"] = encode_properties(m.str_application_properties)
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=_RECEIVED_ARROW)


_TS = pa.timestamp("us", tz="UTC")
_RECEIVED_ARROW = pa.schema([
    ("sequence_number", pa.int64()), *[(n, pa.string()) for n in RECEIVED_COLUMNS[1:10]], ("body", pa.binary()),
    ("application_properties", pa.string()), ("enqueued_time_utc", _TS), ("scheduled_enqueue_time_utc", _TS),
    ("expires_at_utc", _TS), ("delivery_count", pa.int32()), ("lock_token", pa.string()), ("locked_until_utc", _TS),
    ("dead_letter_reason", pa.string()), ("dead_letter_error_description", pa.string())])


def sequence_parts(df: "DataFrame", column: str = "sequence_number") -> "DataFrame":
    """df with its sequence-number column replaced, in place, by `partition` and `number` (the number within
    the partition, from 1): a partitioned entity's sequence numbers carry the partition in their top 16
    bits, as Service Bus's do, which makes them 16-digit numbers people cannot read at a glance."""
    from pyspark.sql import functions as F

    parts = [F.shiftright(F.col(column), sequencing.PARTITION_SHIFT).cast("int").alias("partition"),
             F.col(column).bitwiseAND(F.lit(sequencing.LOW_MASK)).alias("number")]
    return df.select(*[c for name in df.columns for c in (parts if name == column else [F.col(f"`{name}`")])])
