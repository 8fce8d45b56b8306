"""A Structured Streaming query that consumes a queue or subscription (settle 'complete') into a Delta table,
idempotently: each micro-batch is appended with its batch id as a Delta application transaction keyed on
the query, and a batch whose id is already recorded is skipped (what Delta's txnAppId/txnVersion give a
Spark Delta sink). The streaming tests run it in-process (delta_sink) and as a driver process they kill.

    python tests/stream_consumer.py <namespace> <entity> <delta table> <checkpoint> run|drain

run: a trigger every half second until killed; drain: trigger(availableNow=True), then exit.
"""
from __future__ import annotations

import sys
import time
from typing import Any, Callable

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

APP_ID = "sparkbus-stream-test"


def delta_sink(path: str, pause: float = 0.0) -> Callable[[Any, int], None]:
    """A foreachBatch function appending (message_id, body) of each batch to the Delta table at path, once per
    batch id; pause: seconds to wait after each write (a window for the tests' kill)."""
    def write(df: Any, batch_id: int) -> None:
        try:
            done = DeltaTable(path).transaction_version(APP_ID)
        except Exception:  # no table yet
            done = None
        if done is not None and done >= batch_id:
            return
        rows = df.select("message_id", "body").toArrow()
        rows = rows.cast(pa.schema([("message_id", pa.string()), ("body", pa.binary())]))
        write_deltalake(path, rows, mode="append",
                        commit_properties=CommitProperties(app_transactions=[Transaction(APP_ID, batch_id)]))
        time.sleep(pause)
    return write


def written(path: str) -> list[str]:
    """The bodies in the Delta table (empty when there is none yet), as text, in no particular order."""
    try:
        return [body.decode() for body in DeltaTable(path).to_pyarrow_table(columns=["body"])["body"].to_pylist()]
    except Exception:
        return []


def main(namespace: str, entity: str, table: str, checkpoint: str, mode: str) -> None:
    from sparkbus.spark import get_spark

    spark = get_spark("sparkbus-stream-consumer", master="local[2]",
                      settings={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"})
    writer = (spark.readStream.format("sparkbus").option("namespace", namespace).option("entity", entity)
              .option("settle", "complete").load()
              .writeStream.foreachBatch(delta_sink(table, pause=0.5 if mode == "run" else 0.0))
              .option("checkpointLocation", checkpoint))
    writer = writer.trigger(processingTime="0.5 seconds") if mode == "run" else writer.trigger(availableNow=True)
    query = writer.start()
    print("started", flush=True)
    query.awaitTermination()


if __name__ == "__main__":
    main(*sys.argv[1:6])
