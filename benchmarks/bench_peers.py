"""sparkbus side by side with PostgreSQL and RabbitMQ on this machine, in one run.

    make bench-peers          # or: python benchmarks/bench_peers.py [--quick] [--only ...] [--workloads ...]
    make bench-peers-quick    # about 2 minutes: 20,000 messages, 200 single operations, 100,000 in the bulk send

The servers are started for the run and stopped afterwards, by pid (benchmarks/servers.py): PostgreSQL with
fsync=on and synchronous_commit=on, a pgmq-style queue table; RabbitMQ with durable classic queues, persistent
messages (delivery_mode=2), publisher confirms and manual acks. sparkbus runs in a standard namespace with
credit throttling off (premium namespaces of 16 messaging units for 1, 2 and 4 partitions). All data lives
on the same disk (.bench-servers/ in the checkout).

Every message is 1 KiB (a 12-digit id, then bytes from a fixed random pool: incompressible, as real payloads
are, and periodic only every 2 MiB) with message id str(i) and one string property kind=bench. Every drain is
checked for exactly once (each id once, each body intact) and for nothing left in the queue afterwards;
a failed check ends the run with ExactlyOnceError.

Workloads (the same on each system where it applies):
  send        send in batches of 1,000 (sparkbus: create_message_batch() filled until full, the standard tier's
              256 KB batch limit, so about 250 per send call; PostgreSQL: one COPY of 1,000 rows per
              transaction; RabbitMQ: 1,000 publishes, then wait for their confirms). The queue is then drained
              by one process (the `receive` row, 1 process).
  single      single send p50/p99 (PostgreSQL: INSERT in autocommit; RabbitMQ: publish and wait for its confirm),
              then single receive+complete p50/p99, one message at a time (PostgreSQL: lock one row, then delete
              it, two transactions; RabbitMQ: basic_get, then basic_ack). sparkbus's operations take turns
              with commits of the floor's own (untimed for the operation), whose p50 over the same minutes is
              printed beside the goals: it runs beside sparkbus's background work, so it is higher than the
              floor measured alone, which the goals use.
  receive     receive+complete in batches of 1,000 with 1 and 4 processes, messages over wall time (sparkbus:
              receive_messages(1000) + complete_messages on a 16-partition queue; PostgreSQL: pgmq's read and
              delete, i.e. lock 1,000 rows FOR UPDATE SKIP LOCKED by setting their visibility time, then DELETE
              them, two transactions; RabbitMQ: prefetch 1,000, an ack with multiple=True every 1,000). The
              receivers share a count of completed messages and stop when all are completed (none stops on a
              pause while another's messages may still come back); the time is from their common start to the
              last completion, so no idle wait at the end is counted.
  archive     sparkbus only: the `receive` row with 1 process and the single receive+complete p50, on a queue
              with archive_retention set (what leaves goes to its archive as retention removes it), beside the
              same rows without it.
  dataframe   sparkbus send_dataframe of --dataframe-messages against one PostgreSQL COPY of as many rows
              (Spark starts once, before the measurement; a 1,000-row send warms it up, not counted).
  fanout      a topic with 10 subscriptions (each with the default rule) against a RabbitMQ fanout exchange with
              10 durable queues: N sent (batches as in `send`; RabbitMQ: publish with confirms), then
              sparkbus fans out (sparkbus.engine.fanout.drain: the delivery engine of the fan-out query,
              without Spark). Copies receivable per second (sparkbus: from the first send until the fan-out
              returns; RabbitMQ: until the last confirm), and copies received+completed per second (then one
              process drains all 10 subscriptions / queues).
  partitions  sparkbus receive+complete with 1, 2 and 4 partitions (premium namespaces of that
              partition_count) and 16 (a standard partitioned queue), with 1 and 4 processes.
Writes benchmarks/results/peers-<timestamp>.json (and, for a run of every system and workload at the full
counts, not --quick, peers-latest.json and peers-latest.png), and prints a table.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import platform
import queue
import shutil
import signal
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import pika
import psycopg
from psycopg.types.json import Jsonb
from servers import Servers

import sparkbus
from sparkbus import ServiceBusAdministrationClient, ServiceBusClient, ServiceBusMessage
from sparkbus.core.throttling import PREMIUM_CREDITS_PER_UNIT
from sparkbus.exceptions import MessageSizeExceededError
from sparkbus.storage import fsync_file, maintenance

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
SERVERS_DIR = REPO / ".bench-servers"
SIZE = 1024
HEADER = 12  # the message's number, zero-padded, at the start of its body
BATCH = 1000
IDLE = 0.5  # how long a receiver waits for messages before it looks whether the drain is finished
STALL = 60  # a drain in which no receiver completed anything for this long ends (and its check fails)
START_TIMEOUT = 120  # seconds for receiver processes to start and connect
WARMUP = 20  # single operations done first and left out of the latency figures
SUBSCRIPTIONS = 10
PROPERTY = {"kind": "bench"}
SYSTEMS = ("sparkbus", "rabbitmq", "postgres")
LABELS = {"sparkbus": "sparkbus", "rabbitmq": "RabbitMQ", "postgres": "PostgreSQL"}
WORKLOADS = ("send", "single", "receive", "archive", "dataframe", "fanout", "partitions")
PARTITION_COUNTS = (1, 2, 4, 16)
PREMIUM_UNITS = 16  # the most a premium namespace takes
QUICK = {"messages": 20_000, "single": 200, "dataframe_messages": 100_000}
PERIOD = 2048  # bodies repeat their random part every PERIOD messages (2 MiB): more than a Parquet page
PADS = [bytes(p) for p in np.frombuffer(np.random.default_rng(27).bytes(PERIOD * (SIZE - HEADER)), np.uint8)
        .reshape(PERIOD, SIZE - HEADER)]


class ExactlyOnceError(AssertionError):
    """A drain received a message twice, missed one, got a changed body, or left messages behind."""


def body(i: int) -> bytes:
    """Message i's 1 KiB body: its number, then random bytes of the pool."""
    return b"%012d" % i + PADS[i % PERIOD]


def check(label: str, ids: list[int], expected: int, bad_bodies: int, left: int) -> None:
    """ExactlyOnceError unless ids are exactly 0..expected-1 once each, every body intact, nothing left."""
    problems = []
    if bad_bodies:
        problems.append(f"{bad_bodies} bodies differ from what was sent")
    if len(ids) != expected or sorted(ids) != list(range(expected)):
        distinct = set(ids)
        problems.append(f"received {len(ids)} ({len(distinct)} distinct) of {expected}: "
                        f"{len(ids) - len(distinct)} duplicates, {len(set(range(expected)) - distinct)} missing")
    if left:
        problems.append(f"{left} messages left in the queue")
    if problems:
        raise ExactlyOnceError(f"{label}: " + "; ".join(problems))


def percentiles(latencies: list[float]) -> tuple[float, float]:
    """(p50, p99) of latencies in ms, after the warm-up operations."""
    measured = sorted(latencies[WARMUP:])
    return statistics.median(measured), measured[max(0, int(len(measured) * 0.99) - 1)]


Drained = tuple[list[int], int, Optional[float]]  # a receiver's ids, bad bodies, time of its last completion


class Progress:
    """Messages completed by all receivers of one drain, shared between their processes. A receiver stops
    once all expected messages are completed (so nobody stops early while another one's messages may still
    come back, and no idle wait at the end is measured), or after STALL s in which no receiver completed
    one (the exactly-once check then reports what is missing)."""

    def __init__(self, context, expected: int) -> None:
        self.count = context.Value("q", 0)
        self.expected = expected
        self._seen, self._since = -1, 0.0  # this process's last look at the count

    def add(self, completed: int) -> None:
        with self.count.get_lock():
            self.count.value += completed

    def finished(self) -> bool:
        value = self.count.value
        if value >= self.expected:
            return True
        if value != self._seen:
            self._seen, self._since = value, time.monotonic()
        return time.monotonic() - self._since > STALL


# ---------------------------------------------------------------------------------------------------- sparkbus

def sb_message(i: int) -> ServiceBusMessage:
    return ServiceBusMessage(body(i), message_id=str(i), application_properties=PROPERTY)


def sb_send_batches(sender, count: int) -> tuple[float, int]:
    """Send messages 0..count-1 in batches filled until full (or BATCH); (seconds, send calls)."""
    calls = 0
    start = time.perf_counter()
    batch = sender.create_message_batch()
    for i in range(count):
        message = sb_message(i)
        try:
            if len(batch) == BATCH:
                raise MessageSizeExceededError("batch holds BATCH messages")
            batch.add_message(message)
        except MessageSizeExceededError:
            sender.send_messages(batch)
            calls += 1
            batch = sender.create_message_batch()
            batch.add_message(message)
    if len(batch):
        sender.send_messages(batch)
        calls += 1
    return time.perf_counter() - start, calls


class Sparkbus:
    """sparkbus through its public API, in namespaces under root."""
    name = "sparkbus"
    single = {"send": "send_messages(one message)",
              "receive": "receive_messages(max_message_count=1) + complete_message"}

    def __init__(self, root: Path) -> None:
        self.root = root
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        self.path = str(root / "standard")
        sparkbus.create_namespace(self.path, credits_per_second=None)
        self.admin = ServiceBusAdministrationClient(self.path)
        self.client = ServiceBusClient(self.path)
        self.spark = None

    def queue(self, name: str, path: Optional[str] = None, partitioned: bool = True, archive: bool = False) -> dict:
        """A queue in the standard namespace (16 partitions), or in the namespace at path; archive: with an
        archive (archive_retention of a day)."""
        admin = ServiceBusAdministrationClient(path) if path else self.admin
        admin.create_queue(name, enable_partitioning=partitioned, max_size_in_megabytes=5120, lock_duration="PT5M",
                           archive_retention="P1D" if archive else None)
        return {"path": path or self.path, "queue": name}

    def send_batches(self, target: dict, count: int) -> tuple[float, dict]:
        with ServiceBusClient(target["path"]).get_queue_sender(target["queue"]) as sender:
            seconds, calls = sb_send_batches(sender, count)
            limit = sender.create_message_batch().max_size_in_bytes
        return seconds, {"method": f"create_message_batch() filled until full ({limit:,} bytes, the tier's batch "
                                   f"limit) or {BATCH:,} messages, then send_messages(batch)",
                         "messages_per_send_call": round(count / calls, 1)}

    def single_send(self, target: dict, count: int, between: Optional[Callable[[], object]] = None) -> list[float]:
        """count single sends' times (ms); between: called after each, untimed (a floor commit)."""
        latencies, self.send_spans = [], []
        with self.client.get_queue_sender(target["queue"]) as sender:
            for i in range(count):
                message = sb_message(i)
                start = time.perf_counter()
                sender.send_messages(message)
                end = time.perf_counter()
                latencies.append((end - start) * 1000)
                self.send_spans.append((start, end))
                if between is not None:
                    between()
        return latencies

    def beside_maintenance(self) -> dict:
        """Of the last single sends after the warm-up: how many ran beside a job of the maintenance thread
        (compaction, checkpoint, log cleanup) and the p50 and p99 of those that ran beside none."""
        jobs = list(maintenance.ran)
        alone = [(end - start) * 1000 for start, end in self.send_spans[WARMUP:]
                 if not any(job.started < end and job.ended > start for job in jobs)]
        if not alone:
            return {"sends_beside_a_job": len(self.send_spans) - WARMUP}
        alone.sort()
        return {"sends_beside_a_job": len(self.send_spans) - WARMUP - len(alone),
                "p50_beside_no_job_ms": round(statistics.median(alone), 3),
                "p99_beside_no_job_ms": round(alone[max(0, int(len(alone) * 0.99) - 1)], 3)}

    def single_receive(self, target: dict, count: int,
                       between: Optional[Callable[[], object]] = None) -> tuple[list[float], list[int], int]:
        """count single receive + completes: their times (ms), the ids received and the bodies that were
        wrong; between: called after each, untimed (a floor commit)."""
        latencies, ids, bad = [], [], 0
        with self.client.get_queue_receiver(target["queue"]) as receiver:
            for _ in range(count):
                start = time.perf_counter()
                got = receiver.receive_messages(max_message_count=1, max_wait_time=5)
                if not got:
                    break
                receiver.complete_message(got[0])
                latencies.append((time.perf_counter() - start) * 1000)
                ids.append(int(got[0].message_id))
                bad += bytes(got[0].body) != body(ids[-1])
                if between is not None:
                    between()
        return latencies, ids, bad

    def left(self, target: dict) -> int:
        admin = ServiceBusAdministrationClient(target["path"])
        return admin.get_queue_runtime_properties(target["queue"]).total_message_count

    def drop(self, target: dict) -> None:
        ServiceBusAdministrationClient(target["path"]).delete_queue(target["queue"])

    def fanout(self, count: int) -> dict:
        """Send count to a topic with SUBSCRIPTIONS subscriptions, fan out, then drain every subscription."""
        from sparkbus.engine import fanout
        from sparkbus.engine.catalog import Catalog
        from sparkbus.storage.location import normalize

        self.admin.create_topic("fan", enable_partitioning=True, max_size_in_megabytes=5120)
        for s in range(SUBSCRIPTIONS):
            self.admin.create_subscription("fan", f"s{s}", lock_duration="PT5M")
        start = time.perf_counter()
        with self.client.get_topic_sender("fan") as sender:
            send_seconds, _ = sb_send_batches(sender, count)
        fanout.drain(Catalog(normalize(self.path)), "fan")
        receivable = time.perf_counter() - start
        receivers = [self.client.get_subscription_receiver("fan", f"s{s}") for s in range(SUBSCRIPTIONS)]
        ids: list[list[int]] = [[] for _ in receivers]
        bad, active = 0, set(range(SUBSCRIPTIONS))
        while active:  # one process, round robin over the subscriptions, as RabbitMQ's consumers share a channel
            for s in sorted(active):
                batch = receivers[s].receive_messages(max_message_count=BATCH, max_wait_time=0)
                if not batch:
                    active.discard(s)
                    continue
                for m in batch:
                    ids[s].append(int(m.message_id))
                    bad += bytes(m.body) != body(ids[s][-1])
                receivers[s].complete_messages(batch)
        drained = time.perf_counter() - start
        for s, receiver in enumerate(receivers):
            receiver.close()
            left = self.admin.get_subscription_runtime_properties("fan", f"s{s}").total_message_count
            check(f"sparkbus fan-out, subscription s{s}", ids[s], count, bad, left)
        self.admin.delete_topic("fan")
        return {"receivable_seconds": receivable, "drained_seconds": drained, "send_seconds": send_seconds,
                "method": "topic sender batches as in send; fan-out by sparkbus.engine.fanout.drain in this process; "
                          "drain: one process, receive_messages(1000) + complete_messages round robin"}

    def premium(self, partitions: int) -> str:
        path = str(self.root / f"premium{partitions}")
        # premium is governed by messaging units (4,000 credits/s each): the most units, so that the
        # partition count, not the governor, is what the workload measures
        sparkbus.create_namespace(path, tier="premium", partition_count=partitions, messaging_units=PREMIUM_UNITS)
        return path

    def dataframe(self, count: int) -> tuple[float, dict]:
        """send_dataframe of count rows (bodies as body(i)) into a 16-partition queue, in one commit."""
        from pyspark.sql import functions as F

        from sparkbus.spark import get_spark

        # The whole DataFrame passes through the driver as Arrow: give it room (as benchmarks/bench_send.py).
        spark = get_spark("sparkbus-bench-peers", settings={
            "spark.ui.enabled": "false", "spark.driver.memory": "8g", "spark.driver.maxResultSize": "4g"})
        spark.sparkContext.setLogLevel("ERROR")
        self.spark = spark
        pads = spark.createDataFrame([(k, PADS[k]) for k in range(PERIOD)], "k long, pad binary")

        def frame(n: int):
            rows = spark.range(0, n, 1, 16)
            return rows.join(F.broadcast(pads), (rows.id % PERIOD) == pads.k).select(
                F.concat(F.lpad(F.col("id").cast("string"), HEADER, "0").cast("binary"), F.col("pad")).alias("body"),
                F.col("id").cast("string").alias("message_id"),
                F.create_map(F.lit("kind"), F.lit(PROPERTY["kind"])).alias("application_properties"))

        warm, bulk = self.queue("dfwarm"), self.queue("dataframe")
        with self.client.get_queue_sender(warm["queue"]) as sender:
            sender.send_dataframe(frame(1000))  # JVM and Python workers warmed up; not counted
        with self.client.get_queue_sender(bulk["queue"]) as sender:
            start = time.perf_counter()
            result = sender.send_dataframe(frame(count))
            seconds = time.perf_counter() - start
        stored = self.admin.get_queue_runtime_properties(bulk["queue"]).active_message_count
        if result.message_count != count or stored != count:
            raise ExactlyOnceError(f"sparkbus send_dataframe: sent {result.message_count}, stored {stored}, of {count}")
        for target in (warm, bulk):
            self.drop(target)
        return seconds, {"method": f"send_dataframe, one atomic commit into a 16-partition queue; Spark "
                                   f"{self.spark.sparkContext.master} started before, 1,000-row warm-up not "
                                   f"counted; count checked"}

    def close(self) -> None:
        """Stop Spark. The namespaces stay (each workload deleted its entities, which removes their data):
        their metrics are flushed at interpreter exit, so they are removed at the next run's start."""
        if self.spark is not None:
            self.spark.stop()


def sb_drain(target: dict, barrier, progress: Progress) -> Drained:
    """receive_messages(BATCH, max_wait_time=IDLE) + complete_messages until the drain is finished."""
    ids: list[int] = []
    bad, end = 0, None
    with ServiceBusClient(target["path"]).get_queue_receiver(target["queue"]) as receiver:
        barrier.wait(timeout=START_TIMEOUT)
        while not progress.finished():
            batch = receiver.receive_messages(max_message_count=BATCH, max_wait_time=IDLE)
            if not batch:
                continue
            for m in batch:
                ids.append(int(m.message_id))
                bad += bytes(m.body) != body(ids[-1])
            receiver.complete_messages(batch)
            end = time.time()
            progress.add(len(batch))
    return ids, bad, end


# ---------------------------------------------------------------------------------------------------- PostgreSQL

PG_LOCK = ("UPDATE {t} SET vt = now() + interval '30 seconds', read_ct = read_ct + 1 WHERE id IN "
           "(SELECT id FROM {t} WHERE vt <= now() ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED) "
           "RETURNING id, message_id, body, props")


def pg_copy(conn, table: str, first: int, count: int) -> None:
    """One COPY (binary) of rows first..first+count-1 in the current transaction."""
    with conn.cursor().copy(f"COPY {table} (message_id, body, props) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types(["text", "bytea", "jsonb"])
        for i in range(first, first + count):
            copy.write_row((str(i), body(i), PROPERTY))


class Postgres:
    """A pgmq-style queue table per queue in the benchmark's own PostgreSQL."""
    name = "postgres"
    single = {"send": "INSERT in autocommit (one commit)",
              "receive": "lock one row (UPDATE ... vt, autocommit), then DELETE it (autocommit): two commits"}

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.conn = psycopg.connect(dsn, autocommit=True)

    def queue(self, name: str) -> dict:
        self.conn.execute(f"CREATE TABLE {name} (id bigserial PRIMARY KEY, message_id text NOT NULL, "
                          f"body bytea NOT NULL, props jsonb, vt timestamptz NOT NULL DEFAULT now(), "
                          f"read_ct int NOT NULL DEFAULT 0)")
        self.conn.execute(f"CREATE INDEX ON {name} (vt)")
        return {"dsn": self.dsn, "queue": name}

    def send_batches(self, target: dict, count: int) -> tuple[float, dict]:
        start = time.perf_counter()
        for first in range(0, count, BATCH):
            with self.conn.transaction():
                pg_copy(self.conn, target["queue"], first, min(BATCH, count - first))
        return time.perf_counter() - start, {"method": "COPY (binary) of 1,000 rows per transaction",
                                             "messages_per_send_call": BATCH}

    def single_send(self, target: dict, count: int) -> list[float]:
        insert, latencies = f"INSERT INTO {target['queue']} (message_id, body, props) VALUES (%s, %s, %s)", []
        for i in range(count):
            row = (str(i), body(i), Jsonb(PROPERTY))
            start = time.perf_counter()
            self.conn.execute(insert, row)
            latencies.append((time.perf_counter() - start) * 1000)
        return latencies

    def single_receive(self, target: dict, count: int) -> tuple[list[float], list[int], int]:
        lock, delete = PG_LOCK.format(t=target["queue"]), f"DELETE FROM {target['queue']} WHERE id = %s"
        latencies, ids, bad = [], [], 0
        for _ in range(count):
            start = time.perf_counter()
            row = self.conn.execute(lock, (1,)).fetchone()
            if row is None:
                break
            self.conn.execute(delete, (row[0],))
            latencies.append((time.perf_counter() - start) * 1000)
            ids.append(int(row[1]))
            bad += row[2] != body(ids[-1])
        return latencies, ids, bad

    def left(self, target: dict) -> int:
        return self.conn.execute(f"SELECT count(*) FROM {target['queue']}").fetchone()[0]

    def drop(self, target: dict) -> None:
        self.conn.execute(f"DROP TABLE {target['queue']}")

    def dataframe(self, count: int) -> tuple[float, dict]:
        target = self.queue("bulk")
        start = time.perf_counter()
        with self.conn.transaction():
            pg_copy(self.conn, target["queue"], 0, count)
        seconds = time.perf_counter() - start
        stored = self.left(target)
        if stored != count:
            raise ExactlyOnceError(f"PostgreSQL COPY: stored {stored} of {count}")
        self.drop(target)
        return seconds, {"method": "one COPY (binary) of all rows in one transaction, rows made by the client; "
                                   "count checked"}

    def close(self) -> None:
        self.conn.close()


def pg_drain(target: dict, barrier, progress: Progress) -> Drained:
    """pgmq-style read (lock BATCH rows by their visibility time) + delete until the drain is finished; a
    read that finds nothing (the rest is locked by the other receivers) is retried after IDLE / 10."""
    table, ids = target["queue"], []
    lock, delete = PG_LOCK.format(t=table), f"DELETE FROM {table} WHERE id = ANY(%s)"
    bad, end = 0, None
    with psycopg.connect(target["dsn"], autocommit=True) as conn:
        barrier.wait(timeout=START_TIMEOUT)
        while not progress.finished():
            rows = conn.execute(lock, (BATCH,)).fetchall()
            if not rows:
                time.sleep(IDLE / 10)
                continue
            for _, message_id, data, _ in rows:
                ids.append(int(message_id))
                bad += data != body(ids[-1])
            conn.execute(delete, ([r[0] for r in rows],))
            end = time.time()
            progress.add(len(rows))
    return ids, bad, end


# ---------------------------------------------------------------------------------------------------- RabbitMQ

def rmq_params(port: int) -> pika.ConnectionParameters:
    """Loopback, no heartbeats: a blocking connection sends them only while it is used, and the control
    connection waits idle while the other systems run."""
    return pika.ConnectionParameters("127.0.0.1", port, heartbeat=0)


def rmq_properties(i: int) -> pika.BasicProperties:
    return pika.BasicProperties(delivery_mode=2, message_id=str(i), headers=PROPERTY)


def rmq_publish(port: int, exchange: str, routing_key: str, count: int) -> float:
    """Publish messages 0..count-1 in rounds of BATCH, each round waiting for all its confirms (pika's
    blocking channel waits for each confirm, so this uses its asynchronous connection); returns seconds."""
    state = {"next": 0, "pending": set(), "tag": 0, "start": 0.0, "end": 0.0, "error": None}

    def publish_round(channel) -> None:
        if state["next"] >= count:
            state["end"] = time.perf_counter()
            channel.connection.close()
            return
        for i in range(state["next"], min(state["next"] + BATCH, count)):
            channel.basic_publish(exchange, routing_key, body(i), rmq_properties(i))
            state["tag"] += 1
            state["pending"].add(state["tag"])
        state["next"] = min(state["next"] + BATCH, count)

    def confirmed(frame, channel) -> None:
        method = frame.method
        if isinstance(method, pika.spec.Basic.Nack):
            state["error"] = f"broker nacked delivery tag {method.delivery_tag}"
            state["end"] = time.perf_counter()
            channel.connection.close()
            return
        if method.multiple:
            state["pending"] = {t for t in state["pending"] if t > method.delivery_tag}
        else:
            state["pending"].discard(method.delivery_tag)
        if not state["pending"]:
            publish_round(channel)

    def channel_closed(channel, reason) -> None:
        if not state["end"]:  # closed by the broker, not by us when done
            state["error"] = f"channel closed: {reason}"
            channel.connection.close()

    def channel_open(channel) -> None:
        def started(_frame) -> None:
            state["start"] = time.perf_counter()
            publish_round(channel)
        channel.add_on_close_callback(channel_closed)
        channel.confirm_delivery(lambda frame: confirmed(frame, channel), callback=started)

    def failed(connection, error) -> None:
        state["error"] = f"connection failed: {error}"
        connection.ioloop.stop()

    connection = pika.SelectConnection(rmq_params(port),
                                       on_open_callback=lambda c: c.channel(on_open_callback=channel_open),
                                       on_open_error_callback=failed,
                                       on_close_callback=lambda c, reason: c.ioloop.stop())
    connection.ioloop.start()
    if state["error"] or state["next"] < count or state["pending"]:
        raise RuntimeError(f"RabbitMQ publish to {exchange or routing_key}: {state['error'] or 'stopped early'}")
    return state["end"] - state["start"]


class Rabbit:
    """Durable classic queues in the benchmark's own RabbitMQ."""
    name = "rabbitmq"
    single = {"send": "basic_publish on a confirm channel: returns once the broker confirmed",
              "receive": "basic_get, then basic_ack (AMQP has no reply to an ack)"}

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn = pika.BlockingConnection(rmq_params(port))
        self.channel = self.conn.channel()
        server = self.conn._impl.server_properties  # what the broker announced when the connection opened
        self.version, self.platform = str(server["version"]), str(server["platform"])

    def queue(self, name: str) -> dict:
        self.channel.queue_declare(name, durable=True)
        return {"port": self.port, "queue": name}

    def send_batches(self, target: dict, count: int) -> tuple[float, dict]:
        return rmq_publish(self.port, "", target["queue"], count), {
            "method": "1,000 persistent publishes (delivery_mode=2), then wait for their publisher confirms",
            "messages_per_send_call": BATCH}

    def single_send(self, target: dict, count: int) -> list[float]:
        latencies = []
        channel = self.conn.channel()
        channel.confirm_delivery()  # basic_publish now returns once the broker confirmed
        for i in range(count):
            properties, data = rmq_properties(i), body(i)
            start = time.perf_counter()
            channel.basic_publish("", target["queue"], data, properties, mandatory=True)
            latencies.append((time.perf_counter() - start) * 1000)
        channel.close()
        return latencies

    def single_receive(self, target: dict, count: int) -> tuple[list[float], list[int], int]:
        latencies, ids, bad = [], [], 0
        for _ in range(count):
            start = time.perf_counter()
            method, properties, data = self.channel.basic_get(target["queue"], auto_ack=False)
            if method is None:
                break
            self.channel.basic_ack(method.delivery_tag)
            latencies.append((time.perf_counter() - start) * 1000)
            ids.append(int(properties.message_id))
            bad += data != body(ids[-1])
        return latencies, ids, bad

    def left(self, target: dict) -> int:
        with pika.BlockingConnection(rmq_params(self.port)) as conn:
            return conn.channel().queue_declare(target["queue"], durable=True, passive=True).method.message_count

    def drop(self, target: dict) -> None:
        self.channel.queue_delete(target["queue"])

    def fanout(self, count: int) -> dict:
        """Publish count to a fanout exchange bound to SUBSCRIPTIONS durable queues, then drain them all."""
        queues = [f"fan{s}" for s in range(SUBSCRIPTIONS)]
        self.channel.exchange_declare("fan", "fanout", durable=True)
        for q in queues:
            self.channel.queue_declare(q, durable=True)
            self.channel.queue_bind(q, "fan")
        start = time.perf_counter()
        publish = rmq_publish(self.port, "fan", "", count)
        receivable = time.perf_counter() - start
        ids: dict[str, list[int]] = {q: [] for q in queues}
        bad, last, acked = 0, None, None
        with pika.BlockingConnection(rmq_params(self.port)) as conn:
            channel = conn.channel()
            channel.basic_qos(prefetch_count=BATCH)

            def deliver(ch, method, properties, data) -> None:
                nonlocal bad, last, acked
                i = int(properties.message_id)
                ids[consumers[method.consumer_tag]].append(i)
                bad += data != body(i)
                last = method.delivery_tag
                if last % BATCH == 0:
                    ch.basic_ack(last, multiple=True)
                    acked = last

            consumers = {channel.basic_consume(q, deliver): q for q in queues}
            received, quiet_since = 0, time.monotonic()
            while received < count * SUBSCRIPTIONS:
                conn.process_data_events(time_limit=0.1)
                now_received = sum(len(v) for v in ids.values())
                if now_received != received:
                    received, quiet_since = now_received, time.monotonic()
                elif time.monotonic() - quiet_since > 30:
                    break  # the check below reports what is missing
            if last != acked:
                channel.basic_ack(last, multiple=True)
            channel.basic_qos(prefetch_count=BATCH)  # a round trip: the acks before it are processed
            drained = time.perf_counter() - start
        for q in queues:
            check(f"RabbitMQ fan-out, queue {q}", ids[q], count, bad, self.left({"queue": q}))
            self.channel.queue_delete(q)
        self.channel.exchange_delete("fan")
        return {"receivable_seconds": receivable, "drained_seconds": drained, "send_seconds": publish,
                "method": "fanout exchange, 10 durable queues; publishes with confirms in rounds of 1,000; drain: "
                          "one connection consuming all 10 queues, prefetch 1,000 each, ack multiple every 1,000"}

    def close(self) -> None:
        self.conn.close()


def rmq_drain(target: dict, barrier, progress: Progress) -> Drained:
    """Consume with prefetch BATCH, ack (multiple) every BATCH deliveries, until the drain is finished. A
    receiver holding fewer than BATCH unacked when deliveries pause for IDLE acks them then; their
    completion counts at the last delivery's time (the pause is waiting, not work)."""
    ids: list[int] = []
    bad, tag, unacked, end, delivered = 0, 0, 0, None, 0.0
    with pika.BlockingConnection(rmq_params(target["port"])) as conn:
        channel = conn.channel()
        channel.basic_qos(prefetch_count=BATCH)
        barrier.wait(timeout=START_TIMEOUT)
        for method, properties, data in channel.consume(target["queue"], inactivity_timeout=IDLE):
            if method is None:
                if unacked:
                    channel.basic_ack(tag, multiple=True)
                    channel.basic_qos(prefetch_count=BATCH)  # a round trip: the ack before it is processed
                    progress.add(unacked)
                    unacked, end = 0, delivered
                if progress.finished():
                    break
                continue
            ids.append(int(properties.message_id))
            bad += data != body(ids[-1])
            tag, delivered, unacked = method.delivery_tag, time.time(), unacked + 1
            if unacked == BATCH:
                channel.basic_ack(tag, multiple=True)
                progress.add(unacked)
                unacked, end = 0, time.time()
        channel.cancel()
    return ids, bad, end


# ---------------------------------------------------------------------------------------------------- processes

DRAINS: dict[str, Callable[[dict, object, Progress], Drained]] = {
    "sparkbus": sb_drain, "postgres": pg_drain, "rabbitmq": rmq_drain}


def drain_process(system: str, target: dict, barrier, progress: Progress, results) -> None:
    """A receiver process: connect, wait for the common start, drain, report (ids, bad bodies, time of its
    last completion); on failure it breaks the barrier (nobody waits for it) and reports the error's text."""
    try:
        results.put(DRAINS[system](target, barrier, progress))
    except BaseException as error:
        barrier.abort()
        results.put(f"{type(error).__name__}: {error}")
        raise


def parallel_drain(system: str, target: dict, processes: int, expected: int) -> tuple[list[int], int, float]:
    """processes receivers (spawned) draining the expected messages of target from a common start: (ids, bad
    bodies, seconds from the start to the last completion)."""
    spawn = multiprocessing.get_context("spawn")  # never fork: the storage and Spark libraries hang after it
    barrier, results, progress = spawn.Barrier(processes + 1), spawn.Queue(), Progress(spawn, expected)
    procs = [spawn.Process(target=drain_process, args=(system, target, barrier, progress, results))
             for _ in range(processes)]
    for p in procs:
        p.start()
    try:
        try:
            barrier.wait(timeout=START_TIMEOUT)
        except threading.BrokenBarrierError:
            raise RuntimeError(f"{system} receiver failed before the start: {results.get(timeout=60)}") from None
        start = time.time()
        outcomes: list = []
        while len(outcomes) < processes:
            try:
                outcomes.append(results.get(timeout=5))
            except queue.Empty:  # a receiver that died without a word (killed, crashed) ends the wait
                if dead := [p.exitcode for p in procs if p.exitcode not in (None, 0)]:
                    raise RuntimeError(f"{system} receiver exited with {dead[0]}") from None
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    failures = [o for o in outcomes if isinstance(o, str)]
    if failures:
        raise RuntimeError(f"{system} receiver failed: {failures[0]}")
    ends = [end for _, _, end in outcomes if end is not None]
    return [i for ids, _, _ in outcomes for i in ids], sum(b for _, b, _ in outcomes), \
        (max(ends) if ends else start) - start


# ---------------------------------------------------------------------------------------------------- workloads

@dataclass(frozen=True)
class Row:
    """One line of the table: key in the JSON, its title, unit, and whether higher is better."""
    key: str
    title: str
    unit: str
    higher: bool = True


def rows_for(args: argparse.Namespace) -> list[Row]:
    n = f"{args.dataframe_messages:,}"
    rows = [Row("send_batch", "send, batches of 1,000", "msg/s"),
            Row("send_single_p50", "single send p50", "ms", False),
            Row("send_single_p99", "single send p99", "ms", False),
            Row("receive_batch_1p", "receive+complete, batches of 1,000, 1 process", "msg/s"),
            Row("receive_batch_4p", "receive+complete, batches of 1,000, 4 processes", "msg/s"),
            Row("receive_single_p50", "single receive+complete p50", "ms", False),
            Row("receive_single_p99", "single receive+complete p99", "ms", False),
            Row("receive_batch_1p_archive", "receive+complete, batches of 1,000, 1 process, archive on", "msg/s"),
            Row("receive_single_p50_archive", "single receive+complete p50, archive on", "ms", False),
            Row("bulk_send", f"bulk send of {n} (send_dataframe / one COPY)", "msg/s"),
            Row("fanout_receivable", f"fan-out to {SUBSCRIPTIONS}: copies receivable", "copies/s"),
            Row("fanout_drained", f"fan-out to {SUBSCRIPTIONS}: copies received+completed", "copies/s")]
    for processes in args.partition_processes:
        for k in PARTITION_COUNTS:
            rows.append(Row(f"receive_partitions_{k}_{processes}p",
                            f"receive+complete, {k} partition{'s' if k > 1 else ''}, {processes} process"
                            f"{'es' if processes > 1 else ''}", "msg/s"))
    return rows


class Results:
    """Figures by row key and system, with what produced them."""

    def __init__(self) -> None:
        self.figures: dict[str, dict[str, dict]] = {}
        self.start = time.monotonic()

    def add(self, key: str, system: str, value: float, **details: object) -> None:
        self.figures.setdefault(key, {})[system] = {"value": value, **details}
        print(f"  {LABELS[system]:10} {key:28} {value:>14,.2f}   (at {time.monotonic() - self.start:.0f} s)",
              flush=True)


def queue_workloads(driver, args: argparse.Namespace, results: Results) -> None:
    """send (then drained by 1 process), receive with 4 processes, single send and single receive."""
    n, system = args.messages, driver.name
    if {"send", "receive"} & args.workloads:
        target = driver.queue("w1")
        seconds, notes = driver.send_batches(target, n)
        if "send" in args.workloads:
            results.add("send_batch", system, n / seconds, messages=n, seconds=seconds, **notes)
        ids, bad, seconds = parallel_drain(system, target, 1, n)
        check(f"{system} receive, 1 process", ids, n, bad, driver.left(target))
        driver.drop(target)
        if "receive" in args.workloads:
            results.add("receive_batch_1p", system, n / seconds, messages=n, seconds=seconds, processes=1)
            target = driver.queue("w4")
            driver.send_batches(target, n)
            ids, bad, seconds = parallel_drain(system, target, 4, n)
            check(f"{system} receive, 4 processes", ids, n, bad, driver.left(target))
            driver.drop(target)
            results.add("receive_batch_4p", system, n / seconds, messages=n, seconds=seconds, processes=4)
    if "single" in args.workloads:
        target, count = driver.queue("single"), args.single + WARMUP
        # sparkbus's single operations take turns with the floor's commits (FloorTable), so that their ratio
        # is also read over the same minutes: on a shared host the floor moved 1.5-2.9 ms between runs
        between: dict[str, list[float]] = {"send": [], "receive": []}
        with FloorTable(SERVERS_DIR / "floor-between") if system == "sparkbus" else contextlib.nullcontext() as floor:
            def turns(kind: str) -> dict:  # (only sparkbus's driver takes turns with the floor)
                return {"between": lambda: between[kind].append(floor.commit())} if floor else {}

            p50, p99 = percentiles(driver.single_send(target, count, **turns("send")))
            notes = {"operations": args.single, "warmup": WARMUP, "method": driver.single["send"]}
            if floor:
                notes["floor_between_ms_p50"] = round(statistics.median(between["send"][WARMUP:]), 3)
            results.add("send_single_p50", system, p50, **notes)
            if system == "sparkbus":
                beside = driver.beside_maintenance()
                notes.update(beside)
                print(f"sparkbus single sends: {beside}", flush=True)
            results.add("send_single_p99", system, p99, **notes)
            latencies, ids, bad = driver.single_receive(target, count, **turns("receive"))
        shutil.rmtree(SERVERS_DIR / "floor-between", ignore_errors=True)
        check(f"{system} single receive", ids, count, bad, driver.left(target))
        driver.drop(target)
        p50, p99 = percentiles(latencies)
        notes = {"operations": args.single, "warmup": WARMUP, "method": driver.single["receive"]}
        if floor:
            notes["floor_between_ms_p50"] = round(statistics.median(between["receive"][WARMUP:]), 3)
        results.add("receive_single_p50", system, p50, **notes)
        results.add("receive_single_p99", system, p99, **notes)


def archive_workload(driver: "Sparkbus", args: argparse.Namespace, results: Results) -> None:
    """The 1-process batched receive and the single receive+complete again, on queues with an archive."""
    n, system = args.messages, driver.name
    target = driver.queue("archived", archive=True)
    driver.send_batches(target, n)
    ids, bad, seconds = parallel_drain(system, target, 1, n)
    check(f"{system} receive, archive on", ids, n, bad, driver.left(target))
    driver.drop(target)
    results.add("receive_batch_1p_archive", system, n / seconds, messages=n, seconds=seconds, processes=1)
    target, count = driver.queue("single-archived", archive=True), args.single + WARMUP
    driver.single_send(target, count)
    latencies, ids, bad = driver.single_receive(target, count)
    check(f"{system} single receive, archive on", ids, count, bad, driver.left(target))
    driver.drop(target)
    results.add("receive_single_p50_archive", system, percentiles(latencies)[0], operations=args.single,
                warmup=WARMUP, method=driver.single["receive"])


def fanout_workload(driver, args: argparse.Namespace, results: Results) -> None:
    n = args.messages
    figures = driver.fanout(n)
    copies = n * SUBSCRIPTIONS
    details = {"messages": n, "subscriptions": SUBSCRIPTIONS, **figures}
    results.add("fanout_receivable", driver.name, copies / figures["receivable_seconds"], **details)
    results.add("fanout_drained", driver.name, copies / figures["drained_seconds"], **details)


def partitions_workload(driver: Sparkbus, args: argparse.Namespace, results: Results) -> None:
    """Receive+complete on queues of 1, 2, 4 (premium namespaces) and 16 partitions (standard)."""
    n = args.messages
    for k in PARTITION_COUNTS:
        path = driver.premium(k) if k < 16 else None
        for processes in args.partition_processes:
            target = driver.queue(f"p{k}x{processes}", path, partitioned=k > 1)
            driver.send_batches(target, n)
            ids, bad, seconds = parallel_drain("sparkbus", target, processes, n)
            check(f"sparkbus receive, {k} partitions, {processes} processes", ids, n, bad, driver.left(target))
            driver.drop(target)
            results.add(f"receive_partitions_{k}_{processes}p", "sparkbus", n / seconds, messages=n, seconds=seconds,
                        partitions=k, processes=processes,
                        namespace=f"premium, partition_count {k}, messaging_units {PREMIUM_UNITS} (governor: "
                                  f"{PREMIUM_CREDITS_PER_UNIT * PREMIUM_UNITS:,} credits/s)" if k < 16
                        else "standard, enable_partitioning, credit throttling off")


def bulk_workload(driver, args: argparse.Namespace, results: Results) -> None:
    n = args.dataframe_messages
    seconds, notes = driver.dataframe(n)
    results.add("bulk_send", driver.name, n / seconds, messages=n, seconds=seconds, **notes)


# ---------------------------------------------------------------------------------------------------- report

def fsync_ms(directory: Path) -> float:
    """Median time of a 4 KiB write + fsync in directory (what every durable commit here pays)."""
    path = directory / "fsync-probe"
    times = []
    with open(path, "wb") as f:
        for _ in range(50):
            start = time.perf_counter()
            f.write(b"x" * 4096)
            f.flush()
            os.fsync(f.fileno())
            times.append((time.perf_counter() - start) * 1000)
    path.unlink()
    return round(statistics.median(times), 3)


CHURN_FILES = 200  # small files the churn thread creates, then removes, every CHURN_SECONDS
CHURN_SECONDS = 0.5


def commit_floor_ms(directory: Path, count: int = 500) -> dict[str, float]:
    """Medians on this disk of the least a durable one-row Delta commit costs, done as sparkbus commits
    (a Parquet file of one 1 KiB row, encoded as sparkbus encodes it, and the log entry, each written into
    an unnamed file made ahead in its directory on another thread; the data file linked to its name; the
    data file, the entry and the partition directory fsynced concurrently; the entry linked to its
    version's name; the log directory fsynced), with no other work; and of what a PostgreSQL commit pays
    (a WAL-style append to a preallocated file + fdatasync). A single send is at least the first; a
    peek-lock receive + complete two. The same commits' p99, alone and beside a thread doing the
    file-system work log cleanup and compaction do (CHURN_FILES small files created, then removed and their
    directory fsynced, every CHURN_SECONDS): that work sits in the journal a commit's fsyncs wait for, so it
    sets the tail a single operation can keep."""
    root = directory / "commit-floor"
    shutil.rmtree(root, ignore_errors=True)
    alone = _floor_commits(root, count)
    stop = threading.Event()
    churn = threading.Thread(target=_churn, args=(root / "churn", stop), daemon=True)
    churn.start()
    try:
        beside = _floor_commits(root, count)
    finally:
        stop.set()
        churn.join()
    wal = root / "wal"
    appends = []
    descriptor = os.open(wal, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(descriptor, bytes(16 << 20))
        os.fsync(descriptor)
        os.lseek(descriptor, 0, os.SEEK_SET)
        for _ in range(count):
            start = time.perf_counter()
            os.write(descriptor, b"w" * (SIZE + 200))
            os.fdatasync(descriptor)
            appends.append((time.perf_counter() - start) * 1000)
    finally:
        os.close(descriptor)
    shutil.rmtree(root, ignore_errors=True)
    p50, p99 = percentiles(alone)
    return {"delta_commit_floor_ms_p50": round(p50, 3), "delta_commit_floor_ms_p99": round(p99, 3),
            "delta_commit_floor_p99_over_p50": round(p99 / p50, 2),
            "delta_commit_floor_p99_over_p50_beside_file_churn": round(percentiles(beside)[1] / p50, 2),
            "wal_append_fdatasync_ms_p50": round(statistics.median(appends), 3)}


def _floor_commits(root: Path, count: int) -> list[float]:
    """count durable one-row commits made as commit_floor_ms says, in a new table at root; their times (ms)."""
    with FloorTable(root) as table:
        return [table.commit() for _ in range(count)]


class FloorTable:
    """A table at root taking the floor's commits one at a time (commit_floor_ms): before the single
    operations' run, and between its operations (Sparkbus.single_send, single_receive), so that their
    ratio to it is also read from the same minutes."""

    def __init__(self, root: Path) -> None:
        import concurrent.futures

        import pyarrow as pa

        shutil.rmtree(root / "_delta_log", ignore_errors=True)
        shutil.rmtree(root / "partition_id=0", ignore_errors=True)
        self.log, self.part = root / "_delta_log", root / "partition_id=0"
        self.log.mkdir(parents=True)
        self.part.mkdir()
        self.row = pa.table({"sequence_number": [1], "message_id": ["m"], "body": [os.urandom(SIZE)]})
        self.directories = [os.open(d, os.O_RDONLY | os.O_DIRECTORY) for d in (self.part, self.log)]
        self.version = 0
        self.pool = concurrent.futures.ThreadPoolExecutor(2)
        self.maker = concurrent.futures.ThreadPoolExecutor(1)
        self.ahead = self.maker.submit(self._unnamed)

    def _unnamed(self) -> list[int]:  # the next commit's data file and entry, made ahead as sparkbus.storage.spares does
        return [os.open(".", os.O_TMPFILE | os.O_WRONLY, 0o644, dir_fd=d) for d in self.directories]

    def commit(self) -> float:
        """One durable one-row commit; its time (ms)."""
        import uuid

        import pyarrow as pa
        import pyarrow.parquet as pq

        start = time.perf_counter()
        (written, staged), self.ahead = self.ahead.result(), self.maker.submit(self._unnamed)
        data = self.part / f"part-{uuid.uuid4()}.parquet"
        try:
            sink = pa.BufferOutputStream()  # encoded in memory, one write: as sparkbus writes small files
            pq.write_table(self.row, sink, compression="none", use_dictionary=False, store_schema=False)
            os.write(written, sink.getvalue())
            os.link(f"/proc/self/fd/{written}", data.name, dst_dir_fd=self.directories[0], follow_symlinks=True)
        finally:
            os.close(written)
        entry = json.dumps({"add": {"path": data.name, "size": data.stat().st_size}}).encode()
        directory = os.open(self.log, os.O_RDONLY | os.O_DIRECTORY)
        try:  # the entry unnamed in the log directory (O_TMPFILE), linked by descriptor (Linux)
            try:
                os.write(staged, entry)
                others = [self.pool.submit(fsync_file, str(p)) for p in (data, self.part)]
                os.fsync(staged)
                for other in others:
                    other.result()
                os.link(f"/proc/self/fd/{staged}", f"{self.version:020d}.json", dst_dir_fd=directory,
                        follow_symlinks=True)
            finally:
                os.close(staged)
            os.fsync(directory)
        finally:
            os.close(directory)
        self.version += 1
        return (time.perf_counter() - start) * 1000

    def __enter__(self) -> "FloorTable":
        return self

    def __exit__(self, *_: object) -> None:
        for spare in self.ahead.result():
            os.close(spare)
        for d in self.directories:
            os.close(d)
        self.pool.shutdown()
        self.maker.shutdown()


def _churn(directory: Path, stop: threading.Event) -> None:
    """Until stop: CHURN_FILES files of 600 bytes created in directory, then removed and the directory
    fsynced, every CHURN_SECONDS (the log entries a cleanup removes, the files a compaction writes)."""
    directory.mkdir(parents=True, exist_ok=True)
    while not stop.is_set():
        names = [directory / f"{i:05d}.json" for i in range(CHURN_FILES)]
        for name in names:
            name.write_bytes(b"x" * 600)
        stop.wait(CHURN_SECONDS / 2)
        for name in names:
            name.unlink()
        fsync_file(str(directory))
        stop.wait(CHURN_SECONDS / 2)


def machine(server_info: dict, load_before: tuple[float, float, float]) -> dict:
    with open("/proc/meminfo") as f:
        memory_kb = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
    versions = {name: metadata.version(name) for name in ("sparkbus", "deltalake", "pyarrow", "pyspark", "psycopg",
                                                          "pika")}
    versions.update(server_info.get("versions", {}))
    return {"nproc": os.cpu_count(), "memory_gib": round(memory_kb / 2**20, 1), "kernel": platform.release(),
            "python": platform.python_version(), "fsync_4k_ms_p50": fsync_ms(SERVERS_DIR),
            **commit_floor_ms(SERVERS_DIR),
            # other work on the machine meanwhile shows here (the run itself keeps about 1-2 cores busy)
            "load_average_1_5_15_min_before": [round(x, 2) for x in load_before],
            "load_average_1_5_15_min_after": [round(x, 2) for x in os.getloadavg()],
            "versions": versions}


def ratio(row: Row, figures: dict, peer: str) -> Optional[float]:
    """sparkbus against peer, oriented so that > 1 means sparkbus is better."""
    ours, theirs = figures.get("sparkbus", {}).get("value"), figures.get(peer, {}).get("value")
    if not ours or not theirs:
        return None
    return ours / theirs if row.higher else theirs / ours


def table(rows: list[Row], figures: dict) -> str:
    def cell(value: Optional[float], unit: str) -> str:
        if value is None:
            return "—"
        return f"{value:,.2f}" if unit == "ms" else f"{value:,.0f}"

    def times(value: Optional[float]) -> str:
        return "—" if value is None else f"{value:.2f}x"

    lines = ["| workload | sparkbus | RabbitMQ | PostgreSQL | sparkbus / PostgreSQL* | sparkbus / RabbitMQ* |",
             "|---|---:|---:|---:|---:|---:|"]
    for row in rows:
        f = figures.get(row.key)
        if not f:
            continue
        lines.append(f"| {row.title} ({row.unit}) | " + " | ".join(cell(f.get(s, {}).get("value"), row.unit)
                                                                  for s in SYSTEMS)
                     + f" | {times(ratio(row, f, 'postgres'))} | {times(ratio(row, f, 'rabbitmq'))} |")
    lines.append("\n\\* > 1 means sparkbus is better: throughput sparkbus / peer, latency peer / sparkbus.")
    return "\n".join(lines)


@dataclass(frozen=True)
class Goal:
    """A goal for the local engine: a figure of this run (a ratio to the durable-commit floor, to its own
    p50, to PostgreSQL or to another row, or a rate) against a bound."""
    title: str
    numerator: str  # row key (sparkbus's figure)
    denominator: Optional[str]  # row key ("postgres:" prefix: PostgreSQL's), "floor", "floor2" or None
    bound: float
    at_most: bool  # measured <= bound (latencies), else >= (throughput)


GOALS = [
    Goal("single send p50 / one durable commit", "send_single_p50", "floor", 2.0, True),
    Goal("single send p99 / its p50", "send_single_p99", "send_single_p50", 3.0, True),
    Goal("single receive+complete p50 / two durable commits", "receive_single_p50", "floor2", 2.0, True),
    Goal("single receive+complete p99 / its p50", "receive_single_p99", "receive_single_p50", 3.0, True),
    Goal("receive+complete in batches of 1,000, 1 process / PostgreSQL", "receive_batch_1p",
         "postgres:receive_batch_1p", 1.0, False),
    Goal("receive+complete in batches of 1,000, 4 processes / PostgreSQL", "receive_batch_4p",
         "postgres:receive_batch_4p", 1.0, False),
    Goal("receive+complete in batches of 1,000, 4 processes / 1 process", "receive_batch_4p", "receive_batch_1p",
         1.0, False),
    Goal("send in batches / PostgreSQL COPY", "send_batch", "postgres:send_batch", 0.5, False),
    Goal("send_dataframe / one COPY", "bulk_send", "postgres:bulk_send", 1.0, False),
    Goal("send_dataframe (msg/s)", "bulk_send", None, 200_000, False),
]


def between_floor(figures: dict) -> str:
    """The single operations' p50 against the floor's commits that took turns with them (FloorTable)."""
    said = []
    for key, label, commits in (("send_single_p50", "single send", 1), ("receive_single_p50", "receive+complete", 2)):
        found = figures.get(key, {}).get("sparkbus", {})
        if found.get("floor_between_ms_p50"):
            floor = found["floor_between_ms_p50"]
            said.append(f"{label} p50 {found['value'] / (commits * floor):.2f}x {'one' if commits == 1 else 'two'} "
                        f"(floor p50 {floor:.2f} ms)")
    return "; ".join(said)


def goals(figures: dict, floor_ms: float) -> list[dict]:
    """Each goal measured in this run (those whose figures it lacks are left out)."""
    def value(key: str) -> Optional[float]:
        system, _, key = key.rpartition(":")
        return figures.get(key, {}).get(system or "sparkbus", {}).get("value")

    found = []
    for goal in GOALS:
        top = value(goal.numerator)
        bottom = {"floor": floor_ms, "floor2": 2 * floor_ms, None: 1.0}.get(goal.denominator) \
            if goal.denominator in ("floor", "floor2", None) else value(goal.denominator)
        if not top or not bottom:
            continue
        measured = top / bottom
        found.append({"goal": goal.title, "measured": round(measured, 3),
                      "bound": f"{'<=' if goal.at_most else '>='} {goal.bound:,g}",
                      "met": measured <= goal.bound if goal.at_most else measured >= goal.bound})
    return found


def goals_table(found: list[dict]) -> str:
    lines = ["| goal | this run | goal | met |", "|---|---:|---:|---|"]
    for g in found:
        shown = f"{g['measured']:,.0f}" if g["measured"] > 1000 else f"{g['measured']:.2f}x"
        lines.append(f"| {g['goal']} | {shown} | {g['bound']} | {'yes' if g['met'] else 'no'} |")
    return "\n".join(lines)


def plot(rows: list[Row], figures: dict, path: Path, title: str) -> None:
    """Grouped horizontal bars per workload, log scale: throughput above, latency below."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if r.key in figures]
    panels = [p for p in ([r for r in shown if r.unit != "ms"], [r for r in shown if r.unit == "ms"]) if p]
    heights = [0.9 * len(p) + 1.2 for p in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(12, sum(heights)), gridspec_kw={"height_ratios": heights},
                             squeeze=False)
    colors = {"sparkbus": "#e8710a", "rabbitmq": "#7b5ea7", "postgres": "#336791"}
    width = 0.26
    for ax, panel in zip(axes[:, 0], panels):
        latency = panel[0].unit == "ms"
        for s, system in enumerate(SYSTEMS):
            ys, values = [], []
            for r, row in enumerate(panel):
                value = figures[row.key].get(system, {}).get("value")
                if value:
                    ys.append(r + (s - 1) * width)
                    values.append(value)
            if not values:
                continue
            bars = ax.barh(ys, values, height=width, color=colors[system], label=LABELS[system])
            ax.bar_label(bars, labels=[f"{v:,.2f}" if latency else f"{v:,.0f}" for v in values], padding=3, fontsize=8)
        ax.set_yticks(range(len(panel)), [f"{r.title} ({r.unit})" for r in panel], fontsize=9)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlabel("milliseconds per operation, log scale (lower is better)" if latency
                      else "messages or copies per second, log scale (higher is better)")
        ax.margins(x=0.15)
        ax.grid(axis="x", alpha=0.3)
        ax.legend(loc="lower right", fontsize=9)
    axes[0, 0].set_title(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------------- main

def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, help="messages per throughput workload (default 200,000; quick 20,000)")
    parser.add_argument("--single", type=int, help="single operations timed (default 1,000; quick 200)")
    parser.add_argument("--dataframe-messages", type=int,
                        help="messages in the bulk send (default 1,000,000; quick 100,000)")
    parser.add_argument("--quick", action="store_true", help="small counts for development: about 2 minutes")
    parser.add_argument("--only", default=",".join(SYSTEMS), help=f"systems, comma-separated: {','.join(SYSTEMS)}")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated: {','.join(WORKLOADS)}")
    parser.add_argument("--partition-processes", default="1,4", help="receiver processes for the partitions workload")
    parser.add_argument("--output", type=Path, default=RESULTS, help="directory for the JSON and PNG results")
    args = parser.parse_args()
    defaults = QUICK if args.quick else {"messages": 200_000, "single": 1_000, "dataframe_messages": 1_000_000}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    args.only = set(_choices(parser, "--only", args.only, SYSTEMS))
    args.workloads = set(_choices(parser, "--workloads", args.workloads, WORKLOADS))
    try:
        args.partition_processes = sorted({int(p) for p in args.partition_processes.split(",")})
    except ValueError:
        parser.error(f"--partition-processes must be comma-separated integers, got {args.partition_processes!r}")
    if args.partition_processes[0] < 1:
        parser.error("--partition-processes must be at least 1")
    return args


def _choices(parser: argparse.ArgumentParser, flag: str, text: str, allowed: tuple[str, ...]) -> list[str]:
    chosen = [c.strip() for c in text.split(",") if c.strip()]
    unknown = sorted(set(chosen) - set(allowed))
    if unknown or not chosen:
        parser.error(f"{flag}: unknown or empty choice {unknown or text!r}; allowed: {','.join(allowed)}")
    return chosen


def run(args: argparse.Namespace, results: Results, servers: Servers) -> dict:
    """Every selected workload on every selected system; returns server facts for the report."""
    info: dict = {"versions": {}, "servers": {}}
    drivers: dict = {}
    try:
        if "postgres" in args.only:
            pg = servers.start_postgres()
            drivers["postgres"] = Postgres(pg["dsn"])
            info["versions"]["postgresql"] = pg["version"]
            info["servers"]["postgresql"] = {"settings": pg["settings"], "port": pg["port"],
                                             "queue_table": "id bigserial primary key, message_id text, body bytea, "
                                                            "props jsonb, vt timestamptz, read_ct int; index on vt"}
        if "rabbitmq" in args.only:
            rmq = servers.start_rabbitmq()
            rabbit = drivers["rabbitmq"] = Rabbit(rmq["port"])
            info["versions"]["rabbitmq"] = rabbit.version
            info["versions"]["erlang"] = rabbit.platform
            info["servers"]["rabbitmq"] = {"port": rmq["port"], "nodename": rmq["nodename"],
                                           "queues": "classic, durable; messages persistent (delivery_mode=2); "
                                                     "publisher confirms; manual acks"}
        if "sparkbus" in args.only:
            drivers["sparkbus"] = Sparkbus(SERVERS_DIR / "sparkbus")
            info["servers"]["sparkbus"] = {"namespace": "standard, credits_per_second=None (throttling off); "
                                                        f"premium namespaces (messaging_units {PREMIUM_UNITS}) for 1, "
                                                        "2, 4 partitions",
                                           "queues": "16 partitions, lock_duration PT5M, max_size_in_megabytes 5120"}
        for system in SYSTEMS:
            if system in drivers:
                print(f"{LABELS[system]}:", flush=True)
                queue_workloads(drivers[system], args, results)
                if "fanout" in args.workloads and system != "postgres":
                    fanout_workload(drivers[system], args, results)
        if "archive" in args.workloads and "sparkbus" in drivers:
            print("sparkbus with an archive:", flush=True)
            archive_workload(drivers["sparkbus"], args, results)
        if "partitions" in args.workloads and "sparkbus" in drivers:
            print("sparkbus partitions:", flush=True)
            partitions_workload(drivers["sparkbus"], args, results)
        if "dataframe" in args.workloads:
            print("bulk send:", flush=True)
            for system in ("postgres", "sparkbus"):  # Spark last: its JVM stays until the end
                if system in drivers:
                    bulk_workload(drivers[system], args, results)
    finally:
        for driver in drivers.values():
            driver.close()
    return info


def main() -> None:
    args = parse_args()
    command = " ".join(["python", *sys.argv])
    print("command:", command, flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the servers are stopped (finally) on kill
    results = Results()
    started, load_before = datetime.now(timezone.utc), os.getloadavg()
    SERVERS_DIR.mkdir(exist_ok=True)
    with Servers(SERVERS_DIR) as servers:
        info = run(args, results, servers)
    seconds = (datetime.now(timezone.utc) - started).total_seconds()
    rows = rows_for(args)
    report = {
        "command": command, "started_utc": started.isoformat(timespec="seconds"), "seconds": round(seconds, 1),
        "machine": machine(info, load_before),
        "parameters": {"messages": args.messages, "single": args.single, "warmup": WARMUP,
                       "dataframe_messages": args.dataframe_messages, "body_bytes": SIZE, "batch": BATCH,
                       "properties": PROPERTY, "quick": args.quick, "systems": sorted(args.only),
                       "workloads": sorted(args.workloads)},
        "servers": info["servers"],
        "ratios": "> 1 means sparkbus is better: throughput sparkbus / peer, latency peer / sparkbus",
        "workloads": {r.key: {"title": r.title, "unit": r.unit, "higher_is_better": r.higher,
                              "results": results.figures[r.key],
                              "sparkbus_vs_postgres": ratio(r, results.figures[r.key], "postgres"),
                              "sparkbus_vs_rabbitmq": ratio(r, results.figures[r.key], "rabbitmq")}
                      for r in rows if r.key in results.figures},
    }
    report["goals"] = goals(results.figures, report["machine"]["delta_commit_floor_ms_p50"])
    args.output.mkdir(parents=True, exist_ok=True)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    text = json.dumps(report, indent=2) + "\n"
    # a run of some systems or workloads, or a quick one, is kept under its time only: "latest" stays the
    # last whole run at the full counts (the figures the goals are read from)
    whole = args.only == set(SYSTEMS) and args.workloads == set(WORKLOADS) and not args.quick
    written = [f"peers-{stamp}.json", *(["peers-latest.json", "peers-latest.png"] if whole else [])]
    for name in (n for n in written if n.endswith(".json")):
        (args.output / name).write_text(text)
    title = (f"sparkbus, RabbitMQ {info['versions'].get('rabbitmq', '-')}, PostgreSQL "
             f"{info['versions'].get('postgresql', '-').split()[0]} on {os.cpu_count()} cores, {stamp}\n"
             f"{args.messages:,} messages of 1 KiB per workload, {args.single:,} single operations")
    if whole:
        plot(rows, results.figures, args.output / "peers-latest.png", title)
    print()
    print(table(rows, results.figures))
    floor = report["machine"]
    print(f"\nOn this disk a durable one-row Delta commit costs at least {floor['delta_commit_floor_ms_p50']:.2f} ms "
          f"at p50 (Parquet file, log entry, their fsyncs; nothing else), a WAL append + fdatasync "
          f"{floor['wal_append_fdatasync_ms_p50']:.2f} ms: a single send is one such commit, a peek-lock "
          "receive + complete two.")
    print(f"Its p99 is {floor['delta_commit_floor_p99_over_p50']:.2f}x its p50 alone, "
          f"{floor['delta_commit_floor_p99_over_p50_beside_file_churn']:.2f}x beside a thread creating and removing "
          f"{CHURN_FILES} small files every {CHURN_SECONDS:g} s (what log cleanup and compaction do beside single "
          "operations): the bound on the p99 goals that this disk sets.")
    print(f"\nGoals for the local engine, measured in this run ({command}):\n")
    print(goals_table(report["goals"]))
    between = between_floor(results.figures)
    if between:
        print(f"\nAgainst the floor's commits made between the single operations (the same minutes): {between}")
    print(f"\nwritten in {args.output}: {', '.join(written)} ({seconds:.0f} s)")


if __name__ == "__main__":
    main()
