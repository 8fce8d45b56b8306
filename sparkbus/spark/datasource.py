"""The "sparkbus" Spark data source: batch and streaming reads of an entity's messages, and a streaming
sink that sends each micro-batch exactly once.

Reads are non-destructive (a tap: nothing is locked or settled). Offsets are, per entity and partition,
the low 48 bits of the last sequence number read: {"<entity path>": {"<partition>": n}}. Sequence numbers
are gap-free and increasing in commit order per partition, so (start, end] names exactly the messages
committed in between; a message completed and removed by retention before a micro-batch reads it is not
seen. Executors read with delta-rs; Spark never opens the Delta tables itself.

With .option("settle", "complete") on a queue or subscription the stream consumes: a micro-batch reads the
messages a receiver could have received when Spark planned it (active, due, not expired), and once Spark
has committed the batch (the source's commit of its offset) they are completed. An offset then also
carries, per entity, the moment it was planned at (AT, epoch milliseconds), so what a batch covers is a
window in (sequence number, due time): those committed by its mark and due by its moment, less those of
the previous offset; a scheduled message falling due later is read by a later batch. The completion is
cumulative: everything of the entity up to the committed offset that is still deliverable is completed, in
one commit per 5,000 messages, so a completion lost with a crash between Spark's commit and ours happens
at the next commit after the restart. A message another receiver holds a lock on is left to it.

With .option("archive", "true") a batch read returns what an entity's archive holds (ArchiveReader), the
time options pruning the archive files it reads to the dates they span.

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
from datetime import datetime, timezone
from typing import Callable, Iterator, Mapping, Optional, Sequence, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
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
from ..engine import archive
from ..exceptions import InvalidOperationError
from ..engine.catalog import Catalog
from ..engine.delivery import Delivery
from ..engine.enqueue import EntityWriter
from ..engine.fanout import topic_cursors
from ..engine.forwarding import sources as forwarding_sources
from ..engine.namespace import governor_of, namespace_root
from ..engine.registry import CachedEntity, EntityDeleted, EntityInfo, resolve
from ..engine.retry import NO_RETRY, RetryPolicy
from ..engine.throttle import Usage
from ..core.schemas import ACTIVE, ARCHIVE_ROWS, BORN_DEAD_LETTER_COLUMNS, GONE_SQL, MESSAGES
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
AT = "at"  # a consuming stream's offsets: when it was planned (epoch ms); see the module docstring
SETTLES = ("none", "complete")
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
    """Messages (start, end] of one partition of one entity (low sequence bits); for a consuming stream
    (since_ms not None), the window of messages deliverable at until_ms less those deliverable at since_ms."""

    entity: str
    messages_uri: str
    locks_uri: str
    partition: int
    start: int
    end: int
    since_ms: Optional[int] = None
    until_ms: Optional[int] = None


def read_slice(piece: Slice) -> Iterator[pa.RecordBatch]:
    """The slice's messages that are not completed or cancelled (consuming: that a receiver could have
    received at until_ms and not at since_ms), oldest first."""
    locks = storage.open_table(piece.locks_uri)  # before messages: see sparkbus.engine.retention
    messages = storage.open_table(piece.messages_uri)
    low, high = sequencing.compose(piece.partition, piece.start), sequencing.compose(piece.partition, piece.end)
    if piece.since_ms is None:
        within, states = f"m.sequence_number > {low}", f"l.state NOT IN ({GONE_SQL})"
    else:  # scheduled messages of earlier sequence numbers may have fallen due since: filtered below
        within, states = f"(m.sequence_number > {low} OR m.scheduled_enqueue_time_utc IS NOT NULL)", f"l.state = '{ACTIVE}'"
    rows = storage.query(f"""
        SELECT m.* FROM messages m
        LEFT JOIN locks l ON l.partition_id = {piece.partition} AND l.sequence_number = m.sequence_number
        WHERE m.partition_id = {piece.partition} AND {within} AND m.sequence_number <= {high}
          AND (l.state IS NULL OR {states})
        ORDER BY m.sequence_number""", messages=messages, locks=locks)
    if piece.since_ms is not None and piece.until_ms is not None:
        rows = rows.filter(_window(rows, low, piece.since_ms, piece.until_ms))
    rows = rows.select(SHOWN.names).cast(SHOWN)
    table = pa.Table.from_arrays([pa.array([piece.entity] * rows.num_rows, pa.string()), *rows.columns], schema=_ARROW)
    yield from table.to_batches()


def _window(rows: pa.Table, low: int, since_ms: int, until_ms: int) -> pa.Array:
    """Which rows a consuming stream's slice holds: due and unexpired at until_ms, and not already due at
    since_ms unless committed after the previous mark (low)."""
    def micros(column: str) -> np.ndarray:
        values = pc.cast(rows[column], pa.timestamp("us", tz="UTC")).cast(pa.int64()).fill_null(-1)
        return np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.int64)
    due, expires = micros("scheduled_enqueue_time_utc"), micros("expires_at_utc")  # -1: unset
    numbers = np.asarray(rows["sequence_number"].to_numpy(zero_copy_only=False), dtype=np.int64)
    visible = (due <= until_ms * 1000) & ((expires < 0) | (expires > until_ms * 1000))
    new = (numbers > low) | (due > since_ms * 1000)
    return pa.array(visible & new)


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
        settle = options.get("settle", "none").lower()
        if settle not in SETTLES:
            raise ValueError(f"settle must be one of {', '.join(SETTLES)}, got {options['settle']!r}")
        self.consuming = settle == "complete"
        self._due_checked: dict[str, float] = {}  # entity -> monotonic time of the last falls_due look
        if self.entity not in WHOLE_NAMESPACE:
            [info] = self.infos()  # fails early for an unknown entity
            if self.consuming:
                check_consumable(info, self.content, self.latest_start)
        elif self.consuming:
            raise ValueError("settle 'complete' consumes one queue or subscription, not a whole namespace")

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

    def stamped(self, latest: Offsets, start: Optional[Offsets], cap: Optional[Offsets]) -> None:
        """A consuming stream's moments (AT) in latest: now where messages arrived since start or a
        scheduled message fell due since; else start's, so an idle stream plans no batch. cap: an
        availableNow target, not to be passed."""
        now_ms = int(time.time() * 1000)
        for path, partitions in latest.items():
            begin = (start or {}).get(path, {})
            since = begin.get(AT, 0)
            arrived = any(n != begin.get(p, 0) for p, n in partitions.items() if p not in (STATE, AT))
            at = now_ms if arrived or self.falls_due(path, since, now_ms) else since
            if cap is not None:
                at = min(at, cap.get(path, {}).get(AT, since))
            partitions[AT] = max(at, since)

    def falls_due(self, path: str, since_ms: int, now_ms: int) -> bool:
        """Whether a scheduled message of the entity fell due after since_ms (looked at once per TICK_SECONDS)."""
        last = self._due_checked.get(path)
        if last is not None and time.monotonic() - last < TICK_SECONDS:
            return False
        self._due_checked[path] = time.monotonic()
        info = next((i for i in self.infos() if i.path == path), None)
        if info is None:
            return False
        due = storage.query("SELECT scheduled_enqueue_time_utc AS due FROM messages "
                            "WHERE scheduled_enqueue_time_utc IS NOT NULL",
                            messages=storage.open_table(info.tables["messages"]))["due"]
        micros = np.asarray(pc.cast(due, pa.timestamp("us", tz="UTC")).cast(pa.int64()).to_numpy(zero_copy_only=False))
        return bool(((micros > since_ms * 1000) & (micros <= now_ms * 1000)).any())

    def settle(self, end: Offsets) -> int:
        """Complete what a consuming stream read up to the offset Spark committed (sparkbus.engine.delivery:
        complete_read); returns how many messages were completed."""
        completed = 0
        for info in self.infos():
            marks = end.get(info.path)
            if marks is None or AT not in marks:
                continue
            up_to = {int(p): sequencing.compose(int(p), n) for p, n in marks.items() if p not in (STATE, AT) and n > 0}
            if not up_to:
                continue
            delivery = Delivery(Catalog(self.root), info.path, (info.kind,), RetryPolicy())
            try:
                completed += delivery.complete_read(info, up_to, datetime.fromtimestamp(marks[AT] / 1000, timezone.utc))
            finally:
                delivery.close()
        return completed

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
                if self.consuming:
                    read[AT] = 0
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
            begin = start.get(path, {})
            since, until = (begin.get(AT, 0), partitions[AT]) if self.consuming and AT in partitions else (None, None)
            for p, last in partitions.items():
                if p in (STATE, AT):
                    continue
                first = begin.get(p, 0)
                if last > first or (since is not None and until is not None and until > since and last > 0):
                    pieces.append(Slice(path, info.tables["messages"], info.tables["locks"], int(p), first, last,
                                        since, until))
        return pieces


class SparkbusStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The stream of an entity's messages (module docstring). A consuming stream completes what Spark has
    committed when Spark says so (commit), and also when it asks for the next offset (latestOffset(start)):
    Spark asks only once the batches up to start are committed, and calls commit for the last batch of a
    run only when it plans another, so a stream that goes idle would otherwise leave its last batch's
    messages behind until more arrive."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.entities = _Entities(options)
        self.target: Optional[Offsets] = None  # trigger(availableNow=True): the offsets at the query's start
        self._initial: Optional[Offsets] = None  # this run's initial offset: nothing was read up to it
        self._settled: Optional[Offsets] = None  # the offset last completed up to

    def prepareForTriggerAvailableNow(self) -> None:
        """availableNow: read what is there now and nothing that arrives later (latestOffset stops here)."""
        self.target = self.entities.marks()
        if self.entities.consuming:
            now_ms = int(time.time() * 1000)
            for partitions in self.target.values():
                partitions[AT] = now_ms

    def initialOffset(self) -> Offsets:
        self._initial = self.entities.starts()
        return self._initial

    def latestOffset(self, start: Optional[Offsets] = None, limit: object = None) -> Offsets:
        if start and start != self._initial:
            self._settle(start)
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
        if self.entities.consuming:
            self.entities.stamped(latest, start, self.target)
        return latest

    def commit(self, end: Offsets) -> None:
        """Spark committed the batches up to end: a consuming stream completes what they read."""
        self._settle(end)

    def _settle(self, end: Offsets) -> None:
        if self.entities.consuming and end != self._settled:
            self.entities.settle(end)
            self._settled = end

    def partitions(self, start: Offsets, end: Offsets) -> Sequence[InputPartition]:
        return self.entities.partitions(start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self.entities.read(partition)


def check_consumable(info: EntityInfo, content: str, latest_start: bool) -> None:
    """ValueError unless a stream may consume the entity (settle 'complete'): a queue or subscription
    without sessions, read as messages from the earliest (the completion covers everything up to an
    offset, so a stream that skipped the messages before its start would complete them unread)."""
    if latest_start:
        raise ValueError("settle 'complete' reads from the earliest message: startingPosition 'latest' would "
                         "complete the messages before it without reading them")
    if info.kind not in ("queue", "subscription"):
        raise ValueError(f"settle 'complete' consumes a queue or subscription; {info.path!r} is a {info.kind} "
                         "(read one of its subscriptions)")
    if info.options.requires_session:
        raise ValueError(f"settle 'complete' cannot consume {info.path!r}: it requires sessions, whose messages "
                         "only a session's lock holder may settle (use a session processor)")
    if content != "messages":
        raise ValueError("settle 'complete' reads messages: it cannot be combined with content 'ranges'")


# .option("archive", "true"): a batch read of the entity's archive (sparkbus.engine.archive), the messages
# that left it, with how and when; startTime / endTime (ISO 8601, UTC unless a zone is given) bound their
# enqueue times, and only the archive files filed under the dates in between are read.
ARCHIVE_COLUMNS = ("delivery_count", "dead_letter_reason", "dead_letter_error_description", "left_time", "left_as")
ARCHIVE_SCHEMA = (SCHEMA + ", delivery_count int, dead_letter_reason string, dead_letter_error_description string, "
                  "left_time timestamp, left_as string")
_ARCHIVE_ARROW = pa.schema([*_ARROW, *(ARCHIVE_ROWS.field(name).with_nullable(True) for name in ARCHIVE_COLUMNS)])
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True)
class ArchiveSlice(InputPartition):
    """One partition of an entity's archive: the archive files to read (paths as in its log) and the range
    of enqueue times."""

    entity: str
    partition: int
    paths: tuple[str, ...]
    start: datetime
    end: Optional[datetime]


def _time_option(options: Mapping[str, str], name: str) -> Optional[datetime]:
    """An ISO 8601 time option (UTC unless it names a zone), None when not given; ValueError otherwise."""
    text = options.get(name)
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{name} must be an ISO 8601 time such as 2026-11-28T09:30:00 (UTC unless a zone is "
                         f"given), got {text!r}") from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


def is_archive_read(options: Mapping[str, str]) -> bool:
    """Whether the options ask for the archive (ValueError for an archive option that is neither true nor
    false)."""
    value = options.get("archive", "false").lower()
    if value not in ("true", "false"):
        raise ValueError(f"archive must be 'true' or 'false', got {options['archive']!r}")
    return value == "true"


class ArchiveReader(DataSourceReader):
    """The messages that left an entity with an archive (ARCHIVE_SCHEMA), enqueued in [startTime, endTime):
    one input partition per entity partition, naming only the archive files of the dates in range."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.root = option_root(options, "source")
        self.shipped = storage.location.shipment(self.root)
        self.entity = options["entity"]
        self.start = _time_option(options, "startTime") or EPOCH
        self.end = _time_option(options, "endTime")
        if self.end is not None and self.end <= self.start:
            raise ValueError(f"endTime must be after startTime, got {self.end.isoformat()} <= {self.start.isoformat()}")
        for name in ("settle", "content", "startingPosition"):
            if name in options:
                raise ValueError(f"the archive is read as a batch of messages: option {name!r} does not apply to it")
        if self._info().options.archive_retention is None:
            raise InvalidOperationError(f"{self.entity!r} keeps no archive: set its archive_retention")

    def _info(self) -> EntityInfo:
        return resolve(self.root, Catalog(self.root).snapshot(), self.entity, ("queue", "topic", "subscription"))

    def partitions(self) -> Sequence[InputPartition]:
        info = self._info()
        chosen = archive.files(info, self.start, self.end)
        return [ArchiveSlice(info.path, p, tuple(chosen.get(p, ())), self.start, self.end)
                for p in range(info.partition_count)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        storage.location.install(self.root, *self.shipped)  # on an executor
        assert isinstance(partition, ArchiveSlice)
        rows = archive.rows(self._info(), partition.partition, list(partition.paths), partition.start, partition.end)
        rows = rows.select([*SHOWN.names, *ARCHIVE_COLUMNS])
        table = pa.Table.from_arrays([pa.array([partition.entity] * rows.num_rows, pa.string()), *rows.columns],
                                     schema=_ARCHIVE_ARROW)
        yield from table.to_batches()


class SparkbusReader(DataSourceReader):
    """A snapshot of the entity's messages that are not completed or cancelled."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.entities = _Entities(options)
        if self.entities.consuming:
            raise ValueError("settle 'complete' applies to streams (spark.readStream): a batch read is a snapshot "
                             "and settles nothing")

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
        if is_archive_read(self.options):
            return ARCHIVE_SCHEMA
        return RANGES_SCHEMA if self.options.get("content", "").lower() == "ranges" else SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return ArchiveReader(self.options) if is_archive_read(self.options) else SparkbusReader(self.options)

    def streamReader(self, schema: StructType) -> SparkbusStreamReader:
        if is_archive_read(self.options):
            raise ValueError("the archive is read with spark.read (a batch); streams read the entity itself")
        return SparkbusStreamReader(self.options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> SparkbusStreamWriter:
        return SparkbusStreamWriter(self.options, schema)
