"""The fan-out streaming query: the sparkbus source over every topic (or one) feeds micro-batches whose
rules are evaluated and whose copies are committed by sparkbus.engine.fanout, exactly once.

Progress that matters lives in the Delta tables (sparkbus.engine.fanout: application transactions per topic
partition in every subscription), not in Spark's checkpoint: each query starts from the topics' own
cursors, so a query's checkpoint is private scratch space, and a second query on the same topic, or a
replay after a crash, copies nothing twice.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Optional

from .. import storage
from ..engine import fanout
from ..engine.catalog import Catalog
from ..engine.registry import resolve
from .datasource import ALL_TOPICS, FORMAT, SparkbusDataSource

DEFAULT_TRIGGER = {"processingTime": "500 milliseconds"}


def _batch(root: str):
    """foreachBatch: the micro-batch is the topic partitions' ranges (the source's "ranges" content, so
    Spark moves no message bodies: collecting 200,000 rows of 1 KiB through the JVM took 9 s); the rows are
    read on the driver with delta-rs, then sparkbus.engine.fanout evaluates and commits them."""
    catalog = Catalog(root)

    def run(df, batch_id: int) -> None:
        spans = df.collect()
        snap = catalog.snapshot()
        for row in snap.of_kind("topic"):
            topic = resolve(root, snap, row.path, ("topic",))
            ranges = {s.partition_id: (s.first_sequence_number, s.last_sequence_number)
                      for s in spans if s.entity == row.path}
            if ranges:
                fanout.deliver_ranges(catalog, topic, ranges)
            fanout.deliver_scheduled(catalog, topic)

    return run


def start(spark, namespace: str, topic_name: Optional[str] = None, *, trigger: Optional[dict] = None,
          available_now: bool = False):
    """Start the fan-out query; returns the StreamingQuery (its checkpoint is removed when it stops)."""
    spark.dataSource.register(SparkbusDataSource)
    root = storage.local_path(namespace)
    if topic_name is not None:
        resolve(root, Catalog(root).snapshot(), topic_name, ("topic",))  # unknown topic -> error now
    checkpoint = tempfile.mkdtemp(prefix="sparkbus-fanout-")
    stream = (spark.readStream.format(FORMAT).option("namespace", root)
              .option("entity", topic_name or ALL_TOPICS).option("content", "ranges").load())
    writer = stream.writeStream.foreachBatch(_batch(root)).option("checkpointLocation", checkpoint)
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(**(trigger or DEFAULT_TRIGGER))
    query = writer.queryName(f"sparkbus-fanout-{os.path.basename(checkpoint)}").start()
    query._sparkbus_checkpoint = checkpoint
    return query


def run_once(spark, namespace: str, topic_name: Optional[str] = None) -> None:
    """Fan out everything pending now (availableNow) and return."""
    query = start(spark, namespace, topic_name, available_now=True)
    try:
        query.awaitTermination()
    finally:
        shutil.rmtree(query._sparkbus_checkpoint, ignore_errors=True)
