"""Send benchmark: bulk DataFrame send into a 16-partition queue, and single-message send latency.

    make bench-send                      # or: python benchmarks/bench_send.py --bulk 1000000 --single 2000
Prints messages/s for the bulk send and p50/p99 latency for single sends, with the command that ran.
"""
from __future__ import annotations

import argparse
import statistics
import time

from common import bench_namespace

from sparkbus import ServiceBusClient, ServiceBusMessage


def bulk(path: str, count: int, size: int) -> None:
    from pyspark.sql import functions as F

    from sparkbus.spark import get_spark

    # The whole DataFrame passes through the driver as Arrow (1 GB here): give it room.
    spark = get_spark("sparkbus-bench", settings={"spark.ui.enabled": "false", "spark.driver.memory": "8g",
                                                  "spark.driver.maxResultSize": "4g"})
    spark.sparkContext.setLogLevel("ERROR")
    sender = ServiceBusClient(path, spark=spark).get_queue_sender("bulk")
    df = spark.range(0, count, 1, 16).select(F.expr(f"repeat('x', {size})").alias("body"))
    warm = spark.range(1000).select(F.expr(f"repeat('x', {size})").alias("body"))
    sender.send_dataframe(warm)  # JVM and Python workers warmed up; not counted
    start = time.perf_counter()
    result = sender.send_dataframe(df)
    elapsed = time.perf_counter() - start
    print(f"bulk DataFrame send: {result.message_count:,} messages of {size} B into 16 partitions in "
          f"{elapsed:.2f} s = {result.message_count / elapsed:,.0f} messages/s")


def single(path: str, count: int, size: int) -> None:
    sender = ServiceBusClient(path).get_queue_sender("single")
    body = b"x" * size
    for _ in range(50):
        sender.send_messages(ServiceBusMessage(body))
    latencies = []
    for _ in range(count):
        start = time.perf_counter()
        sender.send_messages(ServiceBusMessage(body))
        latencies.append((time.perf_counter() - start) * 1000)
    latencies.sort()
    print(f"single-message send: {count:,} sends of {size} B into 16 partitions: p50 "
          f"{statistics.median(latencies):.1f} ms, p99 {latencies[int(count * 0.99) - 1]:.1f} ms, "
          f"{count / (sum(latencies) / 1000):,.0f} sends/s from one sender")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bulk", type=int, default=1_000_000, help="messages in the bulk DataFrame send (0: skip)")
    parser.add_argument("--single", type=int, default=2_000, help="single-message sends (0: skip)")
    parser.add_argument("--size", type=int, default=1024, help="body bytes per message")
    args = parser.parse_args()
    with bench_namespace() as (path, admin):
        admin.create_queue("bulk", enable_partitioning=True, max_size_in_megabytes=5120)
        admin.create_queue("single", enable_partitioning=True)
        if args.single:
            single(path, args.single, args.size)
        if args.bulk:
            bulk(path, args.bulk, args.size)

if __name__ == "__main__":
    main()
