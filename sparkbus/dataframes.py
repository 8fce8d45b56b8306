"""Spark DataFrames as message batches (Spark-specific; the message API never imports this module).

send_dataframe: columns named like the ServiceBusMessage fields (body required, string or binary).
Partition placement runs on the executors as an Arrow-vectorised UDF over the same function the Python
path uses (partitioning.partition_codes), unless no row can carry a key; the driver then commits every
row in one Delta commit with gap-free sequence numbers, duplicate detection and per-row size checks.
The rows pass through the driver because the commit that keeps numbering gap-free under concurrency
(a delta-rs write with a partition-scoped predicate) takes its data from the committing process.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from . import partitioning
from .enqueue import EnqueueResult
from .message import OUTGOING, STRING_PROPERTIES, new_message_ids
from .values import encode_properties

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from .enqueue import EntityWriter

CODE = "_sparkbus_partition_code"
OPTIONAL_COLUMNS = (*STRING_PROPERTIES, "application_properties", "time_to_live", "scheduled_enqueue_time_utc")


def placement_udf(requires_duplicate_detection: bool, partition_count: int):
    """Pandas (Arrow) UDF (session_id, partition_key, message_id) -> placement code, per batch of rows."""
    from pyspark.sql.functions import pandas_udf

    @pandas_udf("int")
    def place(session_ids: pd.Series, keys: pd.Series, message_ids: pd.Series) -> pd.Series:
        def values(series: pd.Series) -> list:
            return [None if v is None or v != v else v for v in series.tolist()]

        return pd.Series(partitioning.partition_codes(values(session_ids), values(keys), values(message_ids),
                                                      requires_duplicate_detection, partition_count), dtype="int32")

    return place


def _check_columns(df: "DataFrame") -> dict[str, object]:
    from pyspark.sql import types as T

    fields = {f.name: f.dataType for f in df.schema.fields}
    if "body" not in fields:
        raise ValueError(f"send_dataframe needs a 'body' column (string or binary); the DataFrame has {sorted(fields)}")
    unknown = sorted(set(fields) - {"body", *OPTIONAL_COLUMNS})
    if unknown:
        raise ValueError(f"unknown message column(s) {unknown}; allowed: body, {', '.join(OPTIONAL_COLUMNS)}")
    expected = {"body": (T.StringType, T.BinaryType), "time_to_live": (T.DayTimeIntervalType,),
                "scheduled_enqueue_time_utc": (T.TimestampType, T.TimestampNTZType), "application_properties": (T.MapType,)}
    for name, dtype in fields.items():
        allowed = expected.get(name, (T.StringType,))
        if not isinstance(dtype, allowed):
            raise TypeError(f"column {name!r} has type {dtype.simpleString()}; expected "
                            f"{' or '.join(a.__name__.replace('Type', '').lower() for a in allowed)}")
    return fields


def _select(df: "DataFrame", fields: dict, writer: "EntityWriter") -> "DataFrame":
    from pyspark.sql import functions as F, types as T

    info = writer.info()
    columns: list["Column"] = []
    body = F.col("body")
    columns.append((F.encode(body, "UTF-8") if isinstance(fields["body"], T.StringType) else body).alias("body"))
    for name in STRING_PROPERTIES:
        present = F.col(f"`{name}`") if name in fields else F.lit(None).cast("string")
        columns.append(present.alias(name))
    for name in ("application_properties", "time_to_live", "scheduled_enqueue_time_utc"):
        if name in fields:
            columns.append(F.col(name))
    selected = df.select(*columns)
    dedup = bool(info.options.get("requires_duplicate_detection"))
    if not ({"session_id", "partition_key"} & set(fields) or (dedup and "message_id" in fields)):
        # No row carries a key yet: placement is decided on the driver (round-robin, or the message ids
        # it generates when the entity de-duplicates).
        return selected
    return selected.withColumn(CODE, placement_udf(dedup, info.partition_count)("session_id", "partition_key", "message_id"))


def _to_outgoing(collected: pa.Table) -> pa.Table:
    """The collected columns in the OUTGOING schema (missing message ids generated, typed properties
    encoded, durations in ms)."""
    n = collected.num_rows
    columns = {}
    for field in OUTGOING:
        if field.name in collected.column_names:
            columns[field.name] = collected[field.name]
        else:
            columns[field.name] = pa.nulls(n, field.type)
    ids = columns["message_id"]
    if ids.null_count:
        columns["message_id"] = pc.coalesce(ids, new_message_ids(n))
    if "application_properties" in collected.column_names:
        maps = collected["application_properties"].to_pylist()
        columns["application_properties"] = pa.array(
            [None if m is None else encode_properties(dict(m)) for m in maps], pa.string())
    if "time_to_live" in collected.column_names:
        micros = pc.cast(collected["time_to_live"], pa.int64())
        columns["time_to_live_ms"] = pc.divide(micros, 1000)
    return pa.table([pc.cast(columns[f.name], f.type) for f in OUTGOING], schema=OUTGOING)


def send_dataframe(writer: "EntityWriter", df: "DataFrame") -> EnqueueResult:
    """Send every row of df in one atomic commit; returns counts and per-partition (first, last) numbers."""
    fields = _check_columns(df)
    collected = _select(df, fields, writer).toArrow()
    rows = _to_outgoing(collected)
    codes = None  # placement computed by the writer on the driver
    if CODE in collected.column_names:
        codes = np.asarray(collected[CODE].to_numpy(zero_copy_only=False), dtype=np.int32)
    return writer.append(rows, codes=codes, batch_limit=False, with_sequence_numbers=False)
