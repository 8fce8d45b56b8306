"""A namespace's background work as one Structured Streaming query: fan-out of topic messages to their
subscriptions, auto-forwarding between entities, or both (the namespace service, sparkbus.spark.service).

The query reads the sparkbus source with content "ranges": each micro-batch names, per entity partition,
the sequence numbers that arrived (Spark moves no message bodies: collecting 200,000 rows of 1 KiB through
the JVM took 9 s). The batch reads the rows itself with delta-rs, on the driver (over Spark Connect, in the
server's Python worker: see batch_function); sparkbus.engine.fanout and
sparkbus.engine.forwarding evaluate and commit them. Progress that matters lives in the Delta tables
(application transactions in every destination, see those modules), not in Spark's checkpoint: each query
starts from the entities' own cursors and claims, so its checkpoint is private scratch space, and a second
query on the same namespace, or a replay after a crash, copies nothing twice.
"""
from __future__ import annotations

import functools
import logging
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

from .. import storage
from ..core.wording import plural
from ..engine import fanout, forwarding
from ..engine.catalog import Catalog
from ..engine.namespace import namespace_root
from ..engine.registry import resolve
from ..exceptions import MessagingEntityNotFoundError
from . import register
from .datasource import ALL_BACKGROUND, ALL_FORWARDING, ALL_TOPICS, FORMAT, STORAGE_PREFIX

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

LOG = logging.getLogger("sparkbus.service")
DEFAULT_TRIGGER = {"processingTime": "500 milliseconds"}
_CHECKPOINT = "_sparkbus_checkpoint"  # the attribute of a started query naming its private checkpoint


@dataclass
class BatchReport:
    """What one micro-batch did."""

    batch_id: int
    seconds: float = 0.0
    fanout: fanout.FanoutResult = field(default_factory=fanout.FanoutResult)
    forwarding: forwarding.ForwardResult = field(default_factory=forwarding.ForwardResult)

    def line(self) -> str:
        copies = sum(self.fanout.copies.values())
        forwarded = sum(self.forwarding.forwarded.values())
        return (f"batch {self.batch_id}: fanned out {plural(self.fanout.messages, 'topic message')} as "
                f"{plural(copies, 'copy', 'copies')}, forwarded {plural(forwarded, 'message')}, "
                f"transfer-dead-lettered {sum(self.forwarding.dead_lettered.values())}, in {self.seconds:.2f} s")


@dataclass
class Gate:
    """Lets a stop wait for the batch under way: batches run holding `lock`, and once `closed` is set a
    batch that starts does nothing."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    closed: threading.Event = field(default_factory=threading.Event)


def batch_function(root: str, *, fan_out: bool, forward: bool,
                   on_batch: Optional[Callable[[BatchReport], None]] = None,
                   gate: Optional[Gate] = None) -> Callable[[DataFrame, int], Optional[BatchReport]]:
    """foreachBatch: fan out the topics' ranges in the batch (and their due scheduled messages), then
    forward everything forwardable; on_batch gets the report. Without on_batch and gate the function
    carries only the root, two flags and the namespace's storage options, so it pickles: Spark Connect runs
    foreachBatch in a Python process of its server, which makes its own catalog (a lock or a Catalog does
    not pickle)."""
    if on_batch is None and gate is None:  # the storage options too: the worker has not registered them
        return functools.partial(run_batch, root, fan_out, forward, storage.location.options_for(root))
    gate = gate or Gate()

    def run(df: DataFrame, batch_id: int) -> None:
        with gate.lock:
            if not gate.closed.is_set():
                report = run_batch(root, fan_out, forward, {}, df, batch_id)
                if on_batch is not None:
                    on_batch(report)

    return run


_catalogs: dict[str, Catalog] = {}  # root -> the catalog batches of this process use
_catalogs_guard = threading.Lock()


def run_batch(root: str, fan_out: bool, forward: bool, storage_options: dict[str, str], df: DataFrame,
              batch_id: int) -> BatchReport:
    """One micro-batch of the namespace at root: what batch_function's functions run, in whichever process
    Spark calls them (the driver's; a Spark Connect server's Python worker, which gets the namespace's
    storage options with the function)."""
    storage.location.register_options(root, storage_options)
    with _catalogs_guard:
        if root not in _catalogs:
            _catalogs[root] = Catalog(root)
        catalog = _catalogs[root]
    started = time.monotonic()
    report = BatchReport(batch_id)
    spans = df.collect()
    if fan_out:
        snap = catalog.snapshot()
        for row in snap.of_kind("topic"):
            topic = resolve(root, snap, row.path, ("topic",))
            ranges = {s.partition_id: (s.first_sequence_number, s.last_sequence_number)
                      for s in spans if s.entity == row.path}
            try:
                if ranges:
                    report.fanout.add(fanout.deliver_ranges(catalog, topic, ranges))
                report.fanout.add(fanout.deliver_scheduled(catalog, topic))
            except MessagingEntityNotFoundError:  # deleted since the snapshot: nothing left to fan out
                LOG.info("topic %r was deleted during fan-out: skipped", row.path)
    if forward:
        report.forwarding.add(forwarding.forward_all(catalog))
    report.seconds = time.monotonic() - started
    return report


def is_connect(spark: SparkSession) -> bool:
    """Whether spark is a Spark Connect session (Databricks serverless and shared compute, Databricks
    Connect, `SparkSession.builder.remote(...)`): functions handed to it run in another process."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def start(spark: SparkSession, namespace: str, *, entity: str, fan_out: bool, forward: bool,
          trigger: Optional[dict[str, Any]] = None, available_now: bool = False,
          on_batch: Optional[Callable[[BatchReport], None]] = None, gate: Optional[Gate] = None,
          storage_options: Optional[dict[str, str]] = None) -> StreamingQuery:
    """Start the query over `entity` (one topic, ALL_TOPICS, ALL_FORWARDING or ALL_BACKGROUND); returns the
    StreamingQuery (run_once removes its checkpoint; a stopped query's is removed by stop_query).
    storage_options: of an object-store namespace, as create_namespace takes them."""
    register(spark)
    root = namespace_root(namespace, storage_options)
    if entity not in (ALL_TOPICS, ALL_FORWARDING, ALL_BACKGROUND):
        resolve(root, Catalog(root).snapshot(), entity, ("topic",))  # unknown topic -> error now
    if is_connect(spark):  # the batches run in the server's process: no reports or gate from there
        on_batch = gate = None
    checkpoint = tempfile.mkdtemp(prefix="sparkbus-query-")
    try:
        given = {STORAGE_PREFIX + k: v for k, v in storage.location.options_for(root).items()}
        stream = (spark.readStream.format(FORMAT).option("namespace", root).option("entity", entity)
                  .option("content", "ranges").options(**given).load())
        function = batch_function(root, fan_out=fan_out, forward=forward, on_batch=on_batch, gate=gate)
        # Spark ignores what the function returns; pyspark's hint asks for one returning None
        writer = (stream.writeStream.foreachBatch(function)  # type: ignore[arg-type]
                  .option("checkpointLocation", checkpoint))
        writer = writer.trigger(availableNow=True) if available_now else writer.trigger(**(trigger or DEFAULT_TRIGGER))
        query = writer.queryName(f"sparkbus-{os.path.basename(checkpoint)}").start()
    except BaseException:  # a start that failed leaves no checkpoint behind
        shutil.rmtree(checkpoint, ignore_errors=True)
        raise
    setattr(query, _CHECKPOINT, checkpoint)
    return query


def stop_query(query: StreamingQuery) -> None:
    """Stop the query and remove its private checkpoint."""
    query.stop()
    shutil.rmtree(getattr(query, _CHECKPOINT), ignore_errors=True)


def run_once(spark: SparkSession, namespace: str, *, entity: str, fan_out: bool, forward: bool,
             storage_options: Optional[dict[str, str]] = None) -> BatchReport:
    """Everything pending now (availableNow), then return what its batches did together (nothing is known
    of them over Spark Connect, where they run in the server's process: an empty report)."""
    total = BatchReport(-1)

    def add(report: BatchReport) -> None:
        total.fanout.add(report.fanout)
        total.forwarding.add(report.forwarding)
        total.seconds += report.seconds

    query = start(spark, namespace, entity=entity, fan_out=fan_out, forward=forward, available_now=True,
                  storage_options=storage_options, on_batch=add)
    try:
        query.awaitTermination()
    finally:
        shutil.rmtree(getattr(query, _CHECKPOINT), ignore_errors=True)
    return total
