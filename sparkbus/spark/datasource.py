"""The "sparkbus" Spark data source: batch and streaming reads of an entity's messages, and a streaming
sink that sends each micro-batch exactly once.

Reads are non-destructive (a tap: nothing is locked or settled). Offsets are, per entity and partition,
the low 48 bits of the last sequence number read: {"<entity path>": {"<partition>": n}}. Sequence numbers
are gap-free and increasing in commit order per partition, so (start, end] names exactly the messages
committed in between; a message completed and removed by retention before a micro-batch reads it is not
seen. Executors read with delta-rs; Spark never opens the Delta tables itself.

The sink stages each micro-batch's rows as Arrow files on the executors (as send_dataframe does) and
commits them in one Delta commit that records the batch id as a Delta application transaction keyed on
the checkpoint location: a batch replayed after a crash finds its id recorded and writes nothing.
"""
from __future__ import annotations

import hashlib
import os
import time
import uuid
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, Optional, Sequence, cast

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from .. import storage
from ..core import sequencing
from ..core.throttling import data_cost
from ..engine.catalog import Catalog
from ..engine.enqueue import EntityWriter
from ..engine.fanout import topic_cursors
from ..engine.forwarding import sources as forwarding_sources
from ..engine.namespace import governor_of, namespace_root
from ..engine.registry import CachedEntity, EntityDeleted, EntityInfo, resolve
from ..engine.retry import NO_RETRY
from ..engine.throttle import Usage
from ..core.schemas import BORN_DEAD_LETTER_COLUMNS, GONE_SQL, MESSAGES
from . import dataframes

FORMAT = "sparkbus"
ALL_TOPICS = "*topics"  # entity option of the fan-out query: every topic, including ones created later
ALL_FORWARDING = "*forwarding"  # of the forwarding query: every queue and subscription that forwards
ALL_BACKGROUND = "*namespace"   # of the namespace service: both of the above
WHOLE_NAMESPACE = (ALL_TOPICS, ALL_FORWARDING, ALL_BACKGROUND)
# Offsets of forwarding sources also carry their locks table's version under STATE (a message dead-lettered
# is news to a forwarder of dead-letters), and queries over forwarding sources a TICK entity, a clock in
# TICK_SECONDS steps: scheduled messages falling due change nothing else. Neither names messages to read.
STATE = "state"
TICK = "$tick"
TICK_SECONDS = 5
SCHEMA = (
    "entity string, partition_id int, sequence_number long, message_id string, session_id string, "
    "partition_key string, correlation_id string, content_type string, subject string, `to` string, "
    "reply_to string, reply_to_session_id string, application_properties string, body binary, "
    "time_to_live_ms long, enqueued_time_utc timestamp, scheduled_enqueue_time_utc timestamp, "
    "expires_at_utc timestamp, body_size long, header_size long, transfer_hop_count int, "
    "dead_letter_source_entity string, body_type string")
# The stored message columns but the born_dead_letter ones, which only bridge two commits of fan-out.
SHOWN = pa.schema([f for f in MESSAGES if f.name not in BORN_DEAD_LETTER_COLUMNS])
_ARROW = pa.schema([pa.field("entity", pa.string())] + [f.with_nullable(True) for f in SHOWN])
# .option("content", "ranges"): one row per entity partition and micro-batch naming the sequence numbers
# it covers, no message read (the fan-out and forwarding queries read the rows themselves, on the driver).
RANGES_SCHEMA = "entity string, partition_id int, first_sequence_number long, last_sequence_number long"
_RANGES_ARROW = pa.schema([("entity", pa.string()), ("partition_id", pa.int32()),
                           ("first_sequence_number", pa.int64()), ("last_sequence_number", pa.int64())])
CONTENTS = ("messages", "ranges")
# .option("storage.<name>", value): a storage option of the namespace's store (account_key, sas_token, ...),
# as storage_options of create_namespace and the clients take them; options registered in the driver
# process (by a client or create_namespace) apply too.
STORAGE_PREFIX = "storage."
# Offsets: entity path -> partition (or STATE) as text -> the low bits of its last sequence number read.
Offsets = dict[str, dict[str, int]]


def storage_options(options: Mapping[str, str]) -> dict[str, str]:
    """The storage options among a source's or sink's options (their "storage." prefix removed)."""
    return {k[len(STORAGE_PREFIX):].lower(): v for k, v in options.items() if k.lower().startswith(STORAGE_PREFIX)}


def option_root(options: Mapping[str, str], role: str) -> str:
    """The namespace location of a source's or sink's options, its storage options registered in this
    process (TypeError, ValueError as create_namespace's; ValueError when the option is missing)."""
    if "namespace" not in options or "entity" not in options:
        raise ValueError(f"the sparkbus {role} needs .option('namespace', <namespace location>) and "
                         ".option('entity', <queue, topic or '<topic>/Subscriptions/<name>'>)")
    return namespace_root(options["namespace"], storage_options(options))


@dataclass(frozen=True)
class Slice(InputPartition):
    """Messages (start, end] of one partition of one entity (low sequence bits)."""

    entity: str
    messages_uri: str
    locks_uri: str
    partition: int
    start: int
    end: int


def read_slice(piece: Slice) -> Iterator[pa.RecordBatch]:
    """The slice's messages that are not completed or cancelled, oldest first."""
    locks = storage.open_table(piece.locks_uri)  # before messages: see sparkbus.engine.retention
    messages = storage.open_table(piece.messages_uri)
    low, high = sequencing.compose(piece.partition, piece.start), sequencing.compose(piece.partition, piece.end)
    rows = storage.query(f"""
        SELECT m.* FROM messages m
        LEFT JOIN locks l ON l.partition_id = {piece.partition} AND l.sequence_number = m.sequence_number
        WHERE m.partition_id = {piece.partition} AND m.sequence_number > {low} AND m.sequence_number <= {high}
          AND (l.state IS NULL OR l.state NOT IN ({GONE_SQL}))
        ORDER BY m.sequence_number""", messages=messages, locks=locks)
    rows = rows.select(SHOWN.names).cast(SHOWN)
    table = pa.Table.from_arrays([pa.array([piece.entity] * rows.num_rows, pa.string()), *rows.columns], schema=_ARROW)
    yield from table.to_batches()


@dataclass(frozen=True)
class Ranges(InputPartition):
    """Every slice of a micro-batch in one Spark task (content "ranges": nothing to read, so one task)."""

    slices: tuple[Slice, ...]


def read_ranges(piece: Ranges) -> Iterator[pa.RecordBatch]:
    """One row of RANGES_SCHEMA per slice: sequence numbers start+1 .. end of its partition."""
    yield pa.record_batch([pa.array([s.entity for s in piece.slices], pa.string()),
                           pa.array([s.partition for s in piece.slices], pa.int32()),
                           pa.array([sequencing.compose(s.partition, s.start + 1) for s in piece.slices], pa.int64()),
                           pa.array([sequencing.compose(s.partition, s.end) for s in piece.slices], pa.int64())],
                          schema=_RANGES_ARROW)


class _Entities:
    """The entities a reader covers (one, or every topic) and their partitions' high-water marks."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.root = option_root(options, "source")  # plain data: readers are pickled to workers
        self.shipped = storage.location.shipment(self.root)
        self.entity = options["entity"]
        position = options.get("startingPosition", "earliest").lower()
        if position not in ("earliest", "latest"):
            raise ValueError(f"startingPosition must be 'earliest' or 'latest', got {options['startingPosition']!r}")
        self.latest_start = position == "latest"
        self.content = options.get("content", "messages").lower()
        if self.content not in CONTENTS:
            raise ValueError(f"content must be one of {', '.join(CONTENTS)}, got {options['content']!r}")
        if self.entity not in WHOLE_NAMESPACE:
            self.infos()  # fails early for an unknown entity

    def infos(self) -> list[EntityInfo]:
        snap = Catalog(self.root).snapshot()
        found = []
        if self.entity in (ALL_TOPICS, ALL_BACKGROUND):
            found += [resolve(self.root, snap, row.path, ("topic",)) for row in snap.of_kind("topic")]
        if self.entity in (ALL_FORWARDING, ALL_BACKGROUND):
            found += forwarding_sources(self.root, snap)
        if self.entity not in WHOLE_NAMESPACE:
            found.append(resolve(self.root, snap, self.entity, ("queue", "topic", "subscription")))
        return found

    def marks(self) -> Offsets:
        found: Offsets = {}
        for info in self.infos():
            def read(info: EntityInfo = info) -> dict[str, int]:
                marks = storage.high_water_marks(storage.open_table(info.tables["messages"]))
                read = {str(p): marks.get(p, 0) for p in range(info.partition_count)}
                if self._forwarding(info):
                    read[STATE] = storage.open_table(info.tables["locks"]).version()
                return read
            self._read_into(found, info, read)
        if self.entity in (ALL_FORWARDING, ALL_BACKGROUND):
            found[TICK] = {"0": int(time.time() // TICK_SECONDS)}
        return found

    def _forwarding(self, info: EntityInfo) -> bool:
        return self.entity in (ALL_FORWARDING, ALL_BACKGROUND) and info.kind != "topic"

    def starts(self) -> Offsets:
        """Where a new query starts: a topic at its fan-out cursor, anything else at its first message."""
        if self.latest_start:
            return self.marks()
        found: Offsets = {}
        for info in self.infos():
            def read(info: EntityInfo = info) -> dict[str, int]:
                if info.kind == "topic":
                    cursors = topic_cursors(storage.open_table(info.tables["messages"]), info.partition_count)
                else:
                    cursors = {p: 0 for p in range(info.partition_count)}
                read = {str(p): n for p, n in cursors.items()}
                if self._forwarding(info):
                    read[STATE] = 0
                return read
            self._read_into(found, info, read)
        return found

    def _read_into(self, found: Offsets, info: EntityInfo, read: Callable[[], dict[str, int]]) -> None:
        """found[info.path] = read(); an entity whose tables are gone because it was deleted meanwhile is
        left out by a reader of a whole namespace (MessagingEntityNotFoundError for a reader of that one)."""
        try:
            found[info.path] = read()
        except Exception as error:
            try:
                CachedEntity(Catalog(self.root), info.path, (info.kind,)).confirm(info, error)
            except EntityDeleted:
                if self.entity in WHOLE_NAMESPACE:
                    return
                raise
            raise

    def partitions(self, start: Offsets, end: Offsets) -> Sequence[InputPartition]:
        """Spark's input partitions: one per slice, or all slices in one for content "ranges"."""
        pieces = self.slices(start, end)
        if self.content == "ranges":
            return [Ranges(tuple(pieces))] if pieces else []
        return pieces

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        storage.location.install(self.root, *self.shipped)  # on an executor
        if isinstance(partition, Ranges):
            return read_ranges(partition)
        if isinstance(partition, Slice):
            return read_slice(partition)
        return iter(())  # nothing to read: Spark reads one placeholder partition when partitions() has none

    def slices(self, start: Offsets, end: Offsets) -> list[Slice]:
        infos = {info.path: info for info in self.infos()}
        pieces = []
        for path, partitions in end.items():
            info = infos.get(path)
            if info is None:  # deleted since
                continue
            for p, last in partitions.items():
                if p == STATE:
                    continue
                first = start.get(path, {}).get(p, 0)
                if last > first:
                    pieces.append(Slice(path, info.tables["messages"], info.tables["locks"], int(p), first, last))
        return pieces


class SparkbusStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.entities = _Entities(options)
        self.target: Optional[Offsets] = None  # trigger(availableNow=True): the offsets at the query's start

    def prepareForTriggerAvailableNow(self) -> None:
        """availableNow: read what is there now and nothing that arrives later (latestOffset stops here)."""
        self.target = self.entities.marks()

    def initialOffset(self) -> Offsets:
        return self.entities.starts()

    def latestOffset(self, start: Optional[Offsets] = None, limit: object = None) -> Offsets:
        latest = self.entities.marks()
        begins: Offsets = {}
        if start:  # topics created later start at their cursor; nothing ever moves back
            fresh = self.entities.starts() if any(path not in start for path in latest) else {}
            for path, partitions in latest.items():
                begin = begins[path] = start.get(path) or fresh.get(path, {})
                for p in partitions:
                    partitions[p] = max(partitions[p], begin.get(p, 0))
        if self.target is not None:  # availableNow: nothing past the target (entities created since: nothing)
            for path, partitions in latest.items():
                begin, cap = begins.get(path, {}), self.target.get(path, {})
                for p in partitions:
                    partitions[p] = max(min(partitions[p], cap.get(p, begin.get(p, 0))), begin.get(p, 0))
        return latest

    def partitions(self, start: Offsets, end: Offsets) -> Sequence[InputPartition]:
        return self.entities.partitions(start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self.entities.read(partition)


class SparkbusReader(DataSourceReader):
    """A snapshot of the entity's messages that are not completed or cancelled."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.entities = _Entities(options)

    def partitions(self) -> Sequence[InputPartition]:
        return self.entities.partitions({}, self.entities.marks())

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self.entities.read(partition)


@dataclass
class Staged(WriterCommitMessage):
    path: Optional[str]


class SparkbusStreamWriter(DataSourceStreamArrowWriter):
    """Sends each micro-batch to a queue or topic in one commit, exactly once per batch id."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.root = option_root(options, "sink")
        checkpoint = options.get("checkpointLocation") or options.get("checkpointlocation")
        if not checkpoint:
            raise ValueError("the sparkbus sink needs .option('checkpointLocation', <directory>): the batch ids "
                             "it records for exactly-once delivery are keyed on it")
        dataframes.check_columns(schema)
        self.entity = options["entity"]
        info = resolve(self.root, Catalog(self.root).snapshot(), self.entity, ("queue", "topic"))
        self.dedup = info.options.requires_duplicate_detection
        self.partition_count = info.partition_count
        self.staging = storage.location.join(self.root, dataframes.STAGING_DIR, "sink")
        self.shipped = storage.location.shipment(self.root)
        self.app_id = "sparkbus.sink." + hashlib.sha1(os.path.abspath(checkpoint).encode()).hexdigest()[:16]

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Staged:
        storage.location.install(self.root, *self.shipped)
        path = storage.location.join(self.staging, f"{uuid.uuid4().hex}.arrow")
        rows = (dataframes.complete_batch(batch, self.dedup, self.partition_count) for batch in iterator)
        return Staged(path if dataframes.write_staged(path, rows) else None)

    def commit(self, messages: list[Optional[WriterCommitMessage]], batchId: int) -> None:
        sent = cast("list[Optional[Staged]]", messages)  # Spark hands back what write returned, per task
        paths = [m.path for m in sent if m is not None and m.path]
        try:
            tables = [dataframes.read_staged(p) for p in paths]
            catalog = Catalog(self.root)
            writer = EntityWriter(lambda: resolve(self.root, catalog.snapshot(), self.entity, ("queue", "topic")))
            if tables:
                staged = pa.concat_tables(tables)
                codes = np.asarray(staged[dataframes.CODE].to_numpy(zero_copy_only=False), dtype=np.int32)
                # charged as a send of the batch's rows; a throttled sink waits instead of failing the query
                governor_of(catalog).call(
                    writer.info().path, lambda: writer.append(
                        staged.drop_columns([dataframes.CODE]), codes=codes, batch_limit=False,
                        with_sequence_numbers=False, app_transactions={self.app_id: batchId}),
                    lambda _: Usage(data_cost(staged.num_rows), incoming_messages=staged.num_rows), NO_RETRY,
                    wait=True)
        finally:
            for p in paths:
                storage.location.remove(p)

    def abort(self, messages: list[Optional[WriterCommitMessage]], batchId: int) -> None:
        for m in cast("list[Optional[Staged]]", messages):
            if m is not None and m.path:
                storage.location.remove(m.path)


class SparkbusDataSource(DataSource):
    """spark.read / readStream / writeStream .format("sparkbus") with options namespace and entity."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return RANGES_SCHEMA if self.options.get("content", "").lower() == "ranges" else SCHEMA

    def reader(self, schema: StructType) -> SparkbusReader:
        return SparkbusReader(self.options)

    def streamReader(self, schema: StructType) -> SparkbusStreamReader:
        return SparkbusStreamReader(self.options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> SparkbusStreamWriter:
        return SparkbusStreamWriter(self.options, schema)
