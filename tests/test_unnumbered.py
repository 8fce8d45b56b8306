"""Data files written before their commit numbers them (a bulk send's): filled in place, checked before
and after, numbered again after a conflict."""
from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import stored_messages

from sparkbus import ServiceBusClient, ServiceBusMessage
from sparkbus.core import records, sequencing
from sparkbus.core.encoding import OUTGOING, body_sizes, header_sizes
from sparkbus.core.partitioning import KEYLESS, partition_of
from sparkbus.core.schemas import MESSAGES
from sparkbus.engine.enqueue import FILLED, LATEST_TIME_US, Unnumbered, stored_rows
from sparkbus.storage import commits, unnumbered

SCHEMA = pa.schema([f for f in MESSAGES if f.name != "partition_id"])
STATS = ("sequence_number", "body_size", "header_size", "enqueued_time_utc")


def _rows(count: int, *, ttl_ms: int | None = None, start: int = 0,
          default_ttl: timedelta = timedelta.max) -> tuple[pa.Table, int, int]:
    """count stored message rows as an executor makes them (placeholders in FILLED), with their body and
    header byte sums."""
    outgoing = pa.table({f.name: pa.nulls(count, f.type) for f in OUTGOING}, schema=OUTGOING)
    outgoing = outgoing.set_column(OUTGOING.get_field_index("body"), "body",
                                   pa.array([f"body {start + i}".encode() for i in range(count)], pa.binary()))
    outgoing = outgoing.set_column(OUTGOING.get_field_index("message_id"), "message_id",
                                   pa.array([f"m{start + i}" for i in range(count)]))
    if ttl_ms is not None:
        outgoing = outgoing.set_column(OUTGOING.get_field_index("time_to_live_ms"), "time_to_live_ms",
                                       pa.array([ttl_ms] * count, pa.int64()))
    body, header = body_sizes(outgoing), header_sizes(outgoing)
    written = datetime(2026, 1, 1, tzinfo=timezone.utc)
    rows = stored_rows(outgoing, np.zeros(count, np.int32), np.zeros(count, np.int64), body, header, written,
                       default_ttl).drop_columns(["partition_id"])
    return rows, int(body.sum()), int(header.sum())


def _written(path: str, tables: list[pa.Table]) -> None:
    writer = unnumbered.Writer(path, SCHEMA, STATS, FILLED)
    for table in tables:
        writer.write(table)
    writer.close()


def test_filled_columns_are_overwritten_in_place_and_the_rest_is_untouched(tmp_path):
    path = str(tmp_path / "f.parquet")
    rows, _, _ = _rows(unnumbered.ROW_GROUP_ROWS + 1_000, ttl_ms=60_000)
    _written(path, [rows.slice(0, 40_000), rows.slice(40_000)])
    metadata = pq.ParquetFile(path).metadata
    assert metadata.num_row_groups == 2  # ROW_GROUP_ROWS at most
    names = SCHEMA.names
    group = metadata.row_group(0)
    assert group.column(names.index("sequence_number")).statistics is None  # filled: no Parquet bounds
    assert group.column(names.index("body_size")).statistics is not None
    before = pq.read_table(path)
    numbers = np.arange(1, rows.num_rows + 1, dtype=np.int64) + (3 << sequencing.PARTITION_SHIFT)
    got = unnumbered.fill(path, {"sequence_number": lambda _: numbers,
                                 "expires_at_utc": lambda current: current + 5})
    after = pq.read_table(path)
    assert np.array_equal(got["sequence_number"], numbers)
    assert after["sequence_number"].to_pylist() == numbers.tolist()
    assert np.array_equal(records.stored_int64s(after["expires_at_utc"]),
                          records.stored_int64s(before["expires_at_utc"]) + 5)
    for name in names:  # every other column reads as before
        if name not in ("sequence_number", "expires_at_utc"):
            assert after[name].equals(before[name]), name


def test_a_file_laid_out_otherwise_is_refused_before_anything_is_written(tmp_path):
    rows, _, _ = _rows(500)
    compressed, nulls = str(tmp_path / "snappy.parquet"), str(tmp_path / "nulls.parquet")
    pq.write_table(rows, compressed, compression="snappy")
    with_nulls = rows.set_column(rows.schema.get_field_index("time_to_live_ms"), "time_to_live_ms",
                                 pa.array([None, *range(499)], pa.int64()))
    _written(nulls, [with_nulls])
    for path, name, match in ((compressed, "sequence_number", "not one plain, uncompressed page"),
                              (nulls, "time_to_live_ms", "holds nulls"),
                              (nulls, "message_id", "not one plain")):
        content = open(path, "rb").read()
        with pytest.raises(ValueError, match=match):
            unnumbered.fill(path, {name: lambda current: current + 1})
        assert open(path, "rb").read() == content  # nothing written


def test_a_commit_that_loses_to_another_send_numbers_its_files_again(admin, ns_path, tmp_path):
    admin.create_queue("q", enable_partitioning=True, default_message_time_to_live="PT1H")
    client = ServiceBusClient(ns_path)
    bulk, other = client.get_queue_sender("q"), client.get_queue_sender("q")
    other.send_messages(ServiceBusMessage("first", partition_key="k"))
    writer = bulk._writer
    info = writer.info()
    writer.stats_columns(info)  # the writer's view of the table is at this version from now on
    partition = partition_of("k", 16)
    keyed, body, header = _rows(300, default_ttl=timedelta(hours=1))
    loose, loose_body, loose_header = _rows(200, start=300, default_ttl=timedelta(hours=1))
    staged = tmp_path / "staged"
    staged.mkdir()
    _written(str(staged / "keyed.parquet"), [keyed])
    _written(str(staged / "keyless.parquet"), [loose])
    written_at = records.micros(datetime(2026, 1, 1, tzinfo=timezone.utc))
    files = [Unnumbered(str(staged / "keyed.parquet"), partition, 300, body, header, written_at),
             Unnumbered(str(staged / "keyless.parquet"), KEYLESS, 200, loose_body, loose_header, written_at)]
    other.send_messages(ServiceBusMessage("second", partition_key="k"))  # the bulk writer's numbers are stale
    before = datetime.now(timezone.utc)
    refused = commits.outcomes(info.tables["messages"]).refused
    result = writer.append_unnumbered(files, info=info)
    assert result.message_count == 500
    assert commits.outcomes(info.tables["messages"]).refused == refused + 1  # lost once, numbered again
    stored = stored_messages(admin, "q").to_pylist()
    assert len(stored) == 502 and not os.listdir(staged)  # the files moved into the table
    numbers = sorted(r["sequence_number"] & ((1 << sequencing.PARTITION_SHIFT) - 1) for r in stored
                     if r["partition_id"] == partition)
    assert numbers == list(range(1, len(numbers) + 1))  # after both other sends: no number twice, no gap
    bulk_rows = [r for r in stored if r["message_id"].startswith("m")]
    assert len({r["message_id"] for r in bulk_rows}) == 500
    for r in bulk_rows:
        assert r["enqueued_time_utc"] >= before  # filled at the commit, not the files' placeholders
        assert records.micros(r["expires_at_utc"]) == records.micros(r["enqueued_time_utc"]) + 3_600_000_000
    keyless_partitions = {r["partition_id"] for r in bulk_rows if int(r["message_id"][1:]) >= 300}
    assert len(keyless_partitions) == 1  # a file of keyless messages is placed whole
    assert all(records.micros(r["expires_at_utc"]) < LATEST_TIME_US for r in bulk_rows)
