"""Fan-out benchmark: a topic with 10 subscriptions of 3 SQL rules each.

    make bench-fanout     # or: python benchmarks/bench_fanout.py --messages 1000000 --latency 200
1. Throughput: --messages 1 KiB messages are sent (DataFrame send), then fan-out runs (fanout_once, a
   Structured Streaming query with trigger availableNow, the session's first: its start-up is included);
   then a running fan-out query (500 ms trigger) takes another --messages sent at once, timed from the
   send's return until every message is fanned out. Messages evaluated per second, each against every
   subscription's rules (1 filter evaluation = 1 rule x 1 message x 1 subscription).
2. Latency: with a running fan-out query (500 ms trigger), --latency single sends, each timed from
   send to receivable in a subscription: p50 and p99.
"""
from __future__ import annotations

import argparse
import statistics
import time

from common import bench_namespace

import sparkbus
from sparkbus import ServiceBusClient, ServiceBusMessage, SqlRuleFilter
from sparkbus import storage
from sparkbus.engine import context, fanout, metrics

SUBSCRIPTIONS = 10


def setup(admin) -> None:
    admin.create_topic("events", enable_partitioning=True)
    for i in range(SUBSCRIPTIONS):
        admin.create_subscription("events", f"s{i}")
        admin.delete_rule("events", f"s{i}", "$Default")
        admin.create_rule("events", f"s{i}", "region", filter=SqlRuleFilter(f"region = {i} AND amount > 900"))
        admin.create_rule("events", f"s{i}", "big", filter=SqlRuleFilter(f"amount * 10 >= {9990 - i}"))
        admin.create_rule("events", f"s{i}", "label", filter=SqlRuleFilter(f"sys.Label LIKE 'kind-{i}%' AND n % 100 = {i}"))


def messages_frame(spark, count: int):
    from pyspark.sql import functions as F

    return spark.range(0, count, 1, 16).select(
        F.expr("repeat('x', 1000)").alias("body"),
        F.expr("concat('kind-', CAST(id % 10 AS STRING))").alias("subject"),
        F.create_map(F.lit("region"), F.expr("id % 12"), F.lit("amount"), F.expr("id % 1000"),
                     F.lit("n"), F.expr("id % 1000")).alias("application_properties"))


def send(spark, path: str, count: int) -> None:
    client = ServiceBusClient(path, spark=spark)
    with client.get_topic_sender("events") as sender:
        sent = time.perf_counter()
        sender.send_dataframe(messages_frame(spark, count))
        print(f"sent {count:,} messages in {time.perf_counter() - sent:.1f} s")


def fanned_out(path: str) -> bool:
    """Every topic message has been fanned out (the topic's cursors reached its high-water marks)."""
    from sparkbus import storage
    from sparkbus.core import sequencing
    from sparkbus.engine.catalog import Catalog
    from sparkbus.engine.registry import resolve

    topic = resolve(path, Catalog(path).snapshot(), "events", ("topic",))
    table = storage.open_table(topic.tables["messages"])
    marks = sequencing.high_water_marks(table)
    cursors = fanout.topic_cursors(table, topic.partition_count)
    return all(cursors[p] >= n for p, n in marks.items())


def report(label: str, count: int, took: float, evaluations: int) -> None:
    print(f"{label}: {count:,} messages to {SUBSCRIPTIONS} subscriptions x 3 SQL rules in {took:.1f} s, "
          f"{count / took:,.0f} messages/s, {evaluations / took:,.0f} filter evaluations/s")


def throughput(spark, path: str, count: int) -> None:
    """fanout_once on a session whose first streaming query this is (query start-up included), then a
    running query (500 ms trigger) taking a fresh DataFrame send: time from the send's return until the
    topic's cursors reached its last message."""
    from sparkbus.streaming import fanout_once, start_fanout

    send(spark, path, count)
    before = evaluations(path)
    start = time.perf_counter()
    fanout_once(spark, path, "events")
    report("fanout_once (cold: starts the query)", count, time.perf_counter() - start,
           evaluations(path) - before)
    query = start_fanout(spark, path, "events", trigger={"processingTime": "500 milliseconds"})
    try:
        while query.lastProgress is None:
            time.sleep(0.1)
        send(spark, path, count)
        before = evaluations(path)
        start = time.perf_counter()
        while not fanned_out(path):
            time.sleep(0.05)
        report("running query", count, time.perf_counter() - start, evaluations(path) - before)
    finally:
        query.stop()


def evaluations(path: str) -> int:
    """Filter evaluations charged to the topic by this process (fan-out runs in the driver)."""
    root = storage.local_path(path)
    return metrics.read(root, context.recorder(root), entity="events").credits_used


def latency(spark, path: str, count: int) -> None:
    from sparkbus.streaming import start_fanout

    admin = sparkbus.ServiceBusAdministrationClient(path)
    admin.create_subscription("events", "latency")  # empty: earlier copies must not answer the receives
    admin.delete_rule("events", "latency", "$Default")
    admin.create_rule("events", "latency", "mine", filter=SqlRuleFilter("sys.Label = 'latency' AND n = 3"))
    client = ServiceBusClient(path)
    query = start_fanout(spark, path, "events", trigger={"processingTime": "500 milliseconds"})
    figures = []
    try:
        with client.get_topic_sender("events") as sender, \
                client.get_subscription_receiver("events", "latency") as receiver:
            for i in range(count):
                start = time.perf_counter()
                sender.send_messages(ServiceBusMessage("x", subject="latency", application_properties={"n": 3}))
                got = []
                while not got:
                    got = receiver.receive_messages(1, max_wait_time=0.05)
                receiver.complete_messages(got)
                figures.append(time.perf_counter() - start)
    finally:
        query.stop()
    figures.sort()
    print(f"send to receivable with a running query (500 ms trigger), {count} messages: "
          f"p50 {statistics.median(figures) * 1000:.0f} ms, p99 {figures[int(len(figures) * 0.99) - 1] * 1000:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--latency", type=int, default=200)
    args = parser.parse_args()
    from sparkbus.spark import get_spark

    spark = get_spark("sparkbus-bench", settings={"spark.ui.enabled": "false", "spark.driver.memory": "8g",
                                                  "spark.driver.maxResultSize": "4g"})
    spark.sparkContext.setLogLevel("ERROR")
    with bench_namespace() as (path, admin):
        setup(admin)
        if args.messages:
            throughput(spark, path, args.messages)
        if args.latency:
            latency(spark, path, args.latency)


if __name__ == "__main__":
    main()
