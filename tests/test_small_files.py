"""Parquet files of a few rows encoded in Python (sparkbus.storage.small_files): pyarrow, delta-rs and
Spark's own Parquet reader read them back as written, with the statistics pyarrow's writer gives."""
from __future__ import annotations

import math
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkbus import storage
from sparkbus.core.schemas import LOCKS, MESSAGES, TABLE_CONFIGURATION
from sparkbus.storage import commits, small_files

TS = pa.timestamp("us", tz="UTC")
KINDS = {  # type -> values of it
    pa.int32(): st.integers(-(1 << 31), (1 << 31) - 1),
    pa.int64(): st.integers(-(1 << 63), (1 << 63) - 1),
    pa.string(): st.text(max_size=40),
    pa.binary(): st.binary(max_size=40),
    TS: st.integers(-62135596800 * 10**6, 253402300799 * 10**6),  # datetime's range, in microseconds
    pa.timestamp("us"): st.integers(-62135596800 * 10**6, 253402300799 * 10**6),  # (no time zone)
}


def _array(values: list, kind: pa.DataType) -> pa.Array:
    if pa.types.is_timestamp(kind):
        return pa.array(values, pa.int64()).view(kind)
    return pa.array(values, kind)


@st.composite
def tables(draw) -> pa.Table:
    """A table of a few rows in types small_files covers, nullable or not, in one or more chunks."""
    rows = draw(st.integers(0, small_files.MAX_ROWS))
    fields, columns = [], []
    for i in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(list(KINDS)))
        nullable = draw(st.booleans())
        value = KINDS[kind] if not nullable else st.one_of(st.none(), KINDS[kind])
        values = draw(st.lists(value, min_size=rows, max_size=rows))
        cut = draw(st.integers(0, rows))
        columns.append(pa.chunked_array([_array(values[:cut], kind), _array(values[cut:], kind)], kind))
        fields.append(pa.field(f"c{i}", kind, nullable=nullable))
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


def _statistics(file: pq.ParquetFile) -> list:
    meta = file.metadata.row_group(0)
    found = []
    for i in range(meta.num_columns):
        column = meta.column(i)
        if not column.is_stats_set:
            found.append(None)
            continue
        stats = column.statistics
        found.append((stats.null_count, stats.min, stats.max) if stats.has_min_max else (stats.null_count,))
    return found


@settings(max_examples=500, deadline=None)
@given(table=tables(), data=st.data())
def test_a_few_rows_read_back_as_written_with_the_statistics_pyarrow_writes(table, data):
    named = data.draw(st.sets(st.sampled_from(table.schema.names)))
    encoded = small_files.encoded(table, named)
    assert encoded is not None
    file = pq.ParquetFile(pa.BufferReader(encoded))
    assert file.schema_arrow.equals(table.schema)
    assert file.read().equals(table)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="none", use_dictionary=False, write_statistics=sorted(named) or False,
                   store_schema=False)
    assert _statistics(file) == _statistics(pq.ParquetFile(pa.BufferReader(sink.getvalue())))


def test_a_file_of_no_rows_has_no_statistics_as_pyarrow_writes_it():
    table = pa.Table.from_arrays([pa.array([], pa.int32())], schema=pa.schema([pa.field("n", pa.int32(), False)]))
    file = pq.ParquetFile(pa.BufferReader(small_files.encoded(table, ["n"])))
    assert file.read().equals(table) and _statistics(file) == [None]


def test_text_that_is_not_utf8_is_written_back_as_it_was():
    """A row read from a file another tool wrote may hold bytes that are not UTF-8 in a string column:
    rewriting its file (a commit upserting a neighbouring state row) must keep them, not fail or mend them."""
    raw = b"ok\xff\xfe"
    offsets = pa.py_buffer(np.array([0, len(raw)], dtype=np.int32).tobytes())
    text = pa.Array.from_buffers(pa.string(), 1, [None, offsets, pa.py_buffer(raw)])
    table = pa.table({"state": text})
    encoded = small_files.encoded(table, ["state"])
    read = pq.read_table(pa.BufferReader(encoded))
    assert read["state"].chunks[0].view(pa.binary()).to_pylist() == [raw]


def test_what_it_does_not_cover_is_left_to_pyarrow():
    many = pa.table({"n": pa.array(range(small_files.MAX_ROWS + 1), pa.int64())})
    assert small_files.encoded(many) is None
    assert small_files.encoded(pa.table({"x": pa.array([1.5])})) is None
    assert small_files.encoded(pa.table({"t": pa.array([1], pa.timestamp("ns", "UTC"))})) is None
    required = pa.schema([pa.field("n", pa.int64(), nullable=False)])
    assert small_files.encoded(pa.Table.from_arrays([pa.array([1, None], pa.int64())], schema=required)) is None
    assert small_files.encoded(pa.table({"b": pa.array([b"x" * (small_files.MAX_BYTES + 1)])})) is None


def _state_row(sequence: int) -> pa.Table:
    now = datetime.now(timezone.utc)
    return pa.Table.from_pylist([{"partition_id": 3, "sequence_number": sequence, "state": "locked",
                                  "delivery_count": 1, "lock_token": "token", "locked_until_utc": now,
                                  "dead_letter_reason": None, "dead_letter_error_description": None,
                                  "dead_letter_source": None, "updated_at_utc": now}], schema=LOCKS)


def test_a_one_row_commit_writes_a_small_file_that_delta_rs_and_spark_read(tmp_path, spark):
    """The hot paths' files are small_files' own: delta-rs (its Parquet reader) and Spark's Parquet reader
    (parquet-mr's, the one Delta readers on a cluster use) read the rows as committed."""
    table = storage.create_table(str(tmp_path / "locks"), LOCKS, configuration=TABLE_CONFIGURATION["locks"])
    log = commits.TableLog.of(table)
    rows = _state_row(7)
    data = rows.drop_columns([storage.PARTITION_COLUMN])
    added = commits.write_file(log, 3, data)
    path = str(tmp_path / "locks" / added.path)
    with open(path, "rb") as written:
        assert written.read() == small_files.encoded(commits._without_empty_columns(data), log.stats_columns)
    commits.commit(log, commits.position_of(table), [added], [], commits.Claim({3: (7, math.inf)}))
    read = storage.query("SELECT * FROM locks", locks=storage.open_table(table.table_uri))
    assert read.select(LOCKS.names).cast(LOCKS).to_pylist() == rows.to_pylist()
    row = spark.read.parquet(path).collect()[0]
    assert (row["sequence_number"], row["state"], row["delivery_count"], row["lock_token"]) == (7, "locked", 1, "token")
    assert row["locked_until_utc"].timestamp() == pytest.approx(rows["locked_until_utc"][0].as_py().timestamp())
    assert "dead_letter_reason" not in row.asDict()  # null in every row: left out of the file


def test_a_single_sends_message_row_reads_back_whole(tmp_path):
    """A messages row (its body binary, its times, its many nullable columns) through a small file."""
    table = storage.create_table(str(tmp_path / "messages"), MESSAGES, configuration=TABLE_CONFIGURATION["messages"])
    log = commits.TableLog.of(table)
    now = datetime.now(timezone.utc)
    row = {name: None for name in MESSAGES.names}
    row.update(partition_id=0, sequence_number=1, message_id="m", body=bytes(range(256)) * 4, enqueued_time_utc=now,
               expires_at_utc=now, body_size=1024, header_size=20, application_properties='{"kind": "bench"}')
    data = pa.Table.from_pylist([row], schema=MESSAGES).drop_columns([storage.PARTITION_COLUMN])
    added = commits.write_file(log, 0, data)
    commits.commit(log, commits.position_of(table), [added], [], commits.Claim({0: (1, math.inf)}))
    read = storage.query("SELECT * FROM messages", messages=storage.open_table(table.table_uri))
    assert read.select(MESSAGES.names).cast(MESSAGES).to_pylist() == [row]
    assert added.low["sequence_number"] == added.high["sequence_number"] == 1
