"""Request and message metrics of a namespace, as Azure Monitor shows them for Service Bus: incoming,
successful and throttled requests, user and server errors, incoming and outgoing messages, credits used,
and for premium namespaces the CPU and memory usage.

Each process counts in memory, per ten seconds and entity, in one Recorder per namespace that all its clients
share (a dict update under a lock: nothing on a caller's path touches storage). The counts are persisted
by appending them to the namespace's `_metrics` Delta table: by clients when they close, by the namespace
service periodically, and at interpreter exit. Blind appends do not conflict, so any number of processes
persist at once, and a count leaves memory only after its append committed (a failed append keeps it for
the next). A reader sums the table's rows and this process's counts not yet persisted: what a process did
is visible to itself at once and to every process once persisted.

Reports come per minute (Azure Monitor's finest grain) unless asked for a period of 10 seconds or a multiple
of it: the rows are kept per ten seconds (BUCKET_SECONDS) so a run of a minute or two can be seen in detail.
Rows persisted before the finer grain (one per minute) count at the start of their minute.
"""
from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Optional, cast

import pyarrow as pa
import pyarrow.compute as pc

from ..storage import DeltaError, location
from .. import storage
from ..storage import maintenance
from ..core import records
from ..core.schemas import METRICS, METRICS_COUNTERS
from . import clock, retry

METRICS_DIR = "_metrics"
BUCKET_SECONDS = 10  # the grain rows are counted and persisted at
MINUTE = timedelta(minutes=1)
NAMESPACE = ""  # the entity of operations on the namespace itself (management)


@dataclass(frozen=True)
class Counts:
    """Counters of one period, entity or namespace (names as Azure Monitor's Service Bus metrics)."""

    incoming_requests: int = 0
    successful_requests: int = 0
    throttled_requests: int = 0
    user_errors: int = 0      # requests refused for what they asked (a ServiceBusError, ValueError, ...)
    server_errors: int = 0    # requests that failed for any other reason
    incoming_messages: int = 0
    outgoing_messages: int = 0
    credits_used: int = 0
    processed_messages: int = 0      # handler calls of processors
    failed_messages: int = 0         # handler calls that raised
    abandoned_messages: int = 0      # by a processor (its handler raised, or abandoned the message)
    dead_lettered_messages: int = 0  # by a processor's handler
    lock_renewals: int = 0           # message and session locks an AutoLockRenewer renewed

    def __add__(self, other: "Counts") -> "Counts":
        return Counts(*(getattr(self, n) + getattr(other, n) for n in METRICS_COUNTERS))

    def values(self) -> tuple[int, ...]:
        return tuple(getattr(self, n) for n in METRICS_COUNTERS)


THROTTLED = Counts(incoming_requests=1, throttled_requests=1)
USER_ERROR = Counts(incoming_requests=1, user_errors=1)
SERVER_ERROR = Counts(incoming_requests=1, server_errors=1)
RENEWED = Counts(lock_renewals=1)


def succeeded(credits: int, incoming_messages: int = 0, outgoing_messages: int = 0) -> Counts:
    return Counts(incoming_requests=1, successful_requests=1, incoming_messages=incoming_messages,
                  outgoing_messages=outgoing_messages, credits_used=credits)


@dataclass(frozen=True)
class MetricsPoint(Counts):
    """The counts of the period starting at time_utc; cpu_percent and memory_percent (premium) are the
    share of the machine the namespace's processes used in it (the mean of its samples)."""

    time_utc: datetime = records.EPOCH
    cpu_percent: Optional[float] = None
    memory_percent: Optional[float] = None


@dataclass(frozen=True)
class Metrics(Counts):
    """Totals over the periods in `points` for one entity (entity=None: the whole namespace); cpu_percent
    and memory_percent are those of the latest period that has them."""

    entity: Optional[str] = None
    period: timedelta = MINUTE
    cpu_percent: Optional[float] = None
    memory_percent: Optional[float] = None
    points: tuple[MetricsPoint, ...] = ()


class Recorder:
    """This process's unpersisted counts of one namespace."""

    def __init__(self, root: str, *, resources: bool) -> None:
        self.uri = location.join(root, METRICS_DIR)
        self.resources = resources  # sample CPU and memory (premium)
        self._counts: dict[tuple[int, str], Counts] = {}
        self._samples: dict[int, tuple[float, float]] = {}  # bucket -> (cpu %, memory %)
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._process = f"{socket.gethostname()}:{os.getpid()}"
        self._cpu_mark = (time.monotonic(), _cpu_seconds())

    def add(self, entity: str, counts: Counts) -> None:
        bucket = int(clock.time()) // BUCKET_SECONDS
        with self._lock:
            slot = (bucket, entity)
            self._counts[slot] = self._counts[slot] + counts if slot in self._counts else counts

    def clear(self) -> None:
        """Drop the unpersisted counts (of a namespace that goes away) and stop sampling resources."""
        with self._lock:
            self._counts.clear()
            self._samples.clear()
            self.resources = False

    def pending(self) -> pa.Table:
        """The unpersisted counts as METRICS rows (with a resource sample of now, for premium)."""
        with self._lock:
            if self.resources:
                self._sample()
            return self._rows(dict(self._counts), dict(self._samples))

    def flush(self) -> int:
        """Append the unpersisted counts to the metrics table; returns the rows written. Counts recorded
        meanwhile stay for the next flush."""
        with self._flush_lock:
            with self._lock:
                if self.resources:
                    self._sample()
                counts, samples = dict(self._counts), dict(self._samples)
            if not counts and not samples:
                return 0
            rows = self._rows(counts, samples)
            _append(self.uri, rows)
            with self._lock:  # subtract what was written; what came in meanwhile stays
                for slot, written in counts.items():
                    left = Counts(*(a - b for a, b in zip(self._counts[slot].values(), written.values())))
                    if any(left.values()):
                        self._counts[slot] = left
                    else:
                        del self._counts[slot]
                for bucket in samples:
                    self._samples.pop(bucket, None)
            return cast(int, rows.num_rows)

    def _sample(self) -> None:
        """The process's CPU share of the machine since the last sample, and its memory share now."""
        now, cpu = time.monotonic(), _cpu_seconds()
        then, cpu_then = self._cpu_mark
        if now - then < 0.5 and int(clock.time()) // BUCKET_SECONDS in self._samples:
            return
        self._cpu_mark = (now, cpu)
        share = 100.0 * (cpu - cpu_then) / max(now - then, 1e-6) / (os.cpu_count() or 1)
        self._samples[int(clock.time()) // BUCKET_SECONDS] = (min(share, 100.0), _memory_percent())

    def _rows(self, counts: dict[tuple[int, str], Counts], samples: dict[int, tuple[float, float]]) -> pa.Table:
        keys = sorted(set(counts) | {(bucket, NAMESPACE) for bucket in samples})
        columns: dict[str, list[object]] = {f.name: [] for f in METRICS}
        for bucket, entity in keys:
            columns["time_utc"].append(datetime.fromtimestamp(bucket * BUCKET_SECONDS, timezone.utc))
            columns["entity"].append(entity)
            columns["process"].append(self._process)
            for name, value in zip(METRICS_COUNTERS, counts.get((bucket, entity), Counts()).values()):
                columns[name].append(value)
            cpu, memory = samples.get(bucket, (None, None)) if entity == NAMESPACE else (None, None)
            columns["cpu_percent"].append(cpu)
            columns["memory_percent"].append(memory)
        return pa.table(columns, schema=METRICS)


_upgraded: set[str] = set()  # metrics tables this process has checked for missing columns


def _append(uri: str, rows: pa.Table) -> None:
    """Append rows to the metrics table (created by the first writer), under the one retry policy: an append
    that lost a race (another process's creation, checkpoint or compaction changed the table's metadata)
    is made again on the table read anew, like any commit, never reported as a failure of its own."""
    def attempt() -> None:
        if not storage.table_exists(uri):
            try:
                storage.create_table(uri, METRICS, partition_by=())
            except DeltaError:
                if not storage.table_exists(uri):  # not another process's creation: a real failure
                    raise
        if uri not in _upgraded:  # a table written by an earlier version may lack the later counters
            storage.add_missing_columns(uri, METRICS)
            _upgraded.add(uri)
        table = storage.open_table(uri)
        storage.write(table, rows, mode="append", post_commithook_properties=storage.NO_HOOKS)
        maintenance.after_commit(table)
    retry.run(attempt, what="recording the namespace's metrics")


def _cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def _memory_percent() -> float:
    """Resident memory of this process as a share of the machine's."""
    try:
        with open("/proc/self/statm") as f:
            resident_pages = int(f.read().split()[1])
        return 100.0 * resident_pages / os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError, IndexError):
        return 0.0


def all_rows(root: str, recorder: Optional[Recorder]) -> pa.Table:
    """The persisted METRICS rows of the namespace and the recorder's unpersisted ones."""
    uri = location.join(root, METRICS_DIR)
    parts = [storage.query("SELECT * FROM metrics ORDER BY time_utc", metrics=storage.open_table(uri))
             ] if storage.table_exists(uri) else []
    if recorder is not None:
        parts.append(recorder.pending())
    return pa.concat_tables([_complete(p) for p in parts]) if parts else METRICS.empty_table()


def _complete(rows: pa.Table) -> pa.Table:
    """METRICS rows, counters a table written before them lacks (or left null) as 0."""
    columns = []
    for field in METRICS:
        column = rows[field.name] if field.name in rows.schema.names else pa.nulls(rows.num_rows, field.type)
        columns.append(column.fill_null(0) if field.name in METRICS_COUNTERS else column)
    return pa.Table.from_arrays(columns, schema=METRICS)


def check_period(period: timedelta) -> int:
    """The period in seconds; raises ValueError unless it is a positive multiple of BUCKET_SECONDS."""
    seconds = period.total_seconds() if isinstance(period, timedelta) else 0
    if seconds <= 0 or seconds % BUCKET_SECONDS:
        raise ValueError(f"metrics period must be a positive multiple of {BUCKET_SECONDS} seconds "
                         f"(e.g. 10 s, 1 minute, 1 hour), not {f'{seconds:g} s' if seconds else repr(period)}")
    return int(seconds)


def read(root: str, recorder: Optional[Recorder], *, entity: Optional[str] = None,
         start: Optional[datetime] = None, end: Optional[datetime] = None, period: timedelta = MINUTE) -> Metrics:
    """Totals and per-period points of the namespace (entity=None) or one entity, from the metrics table
    and this process's unpersisted counts, for times in [start, end); raises ValueError for a period
    check_period refuses."""
    seconds = check_period(period)
    rows = all_rows(root, recorder)
    if entity is not None:
        rows = rows.filter(pc.equal(rows["entity"], entity))
    if start is not None:
        rows = rows.filter(pc.greater_equal(rows["time_utc"], pa.scalar(start, METRICS.field("time_utc").type)))
    if end is not None:
        rows = rows.filter(pc.less(rows["time_utc"], pa.scalar(end, METRICS.field("time_utc").type)))
    # the processes' shares of one bucket add up; a period's share is the mean over its sampled buckets
    buckets = rows.group_by("time_utc").aggregate(
        [(n, "sum") for n in METRICS_COUNTERS] + [("cpu_percent", "sum"), ("memory_percent", "sum"),
                                                 ("cpu_percent", "count")])
    sampled = pc.greater(buckets["cpu_percent_count"], 0)
    buckets = buckets.append_column("period", pc.floor_temporal(buckets["time_utc"], multiple=seconds, unit="second"))
    buckets = buckets.append_column("cpu", pc.if_else(sampled, buckets["cpu_percent_sum"], None))
    buckets = buckets.append_column("memory", pc.if_else(sampled, buckets["memory_percent_sum"], None))
    grouped = buckets.group_by("period").aggregate(
        [(f"{n}_sum", "sum") for n in METRICS_COUNTERS] + [("cpu", "mean"), ("memory", "mean")]).sort_by("period")
    points = []
    for row in grouped.to_pylist():
        points.append(MetricsPoint(**{n: row[f"{n}_sum_sum"] for n in METRICS_COUNTERS}, time_utc=row["period"],
                                   cpu_percent=row["cpu_mean"], memory_percent=row["memory_mean"]))
    total = Counts()
    for point in points:
        total = total + Counts(*point.values())
    latest = next((p for p in reversed(points) if p.cpu_percent is not None), None)
    return Metrics(**dict(zip(METRICS_COUNTERS, total.values())), entity=entity, period=period, points=tuple(points),
                   cpu_percent=None if latest is None else latest.cpu_percent,
                   memory_percent=None if latest is None else latest.memory_percent)
